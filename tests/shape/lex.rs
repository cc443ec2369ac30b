//! Rust source as words: comments and the insides of literals dropped, each word
//! with its line, which is all the shape checks need (where items start and end,
//! which paths name which modules). Not a full lexer: it knows comments (nested
//! block ones too), strings (raw ones too), characters apart from lifetimes, and
//! `::`.

/// One word of source.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum Tok {
    /// An identifier, keyword or number.
    Word(String),
    /// `::`.
    Sep,
    /// A string or character literal, its text dropped.
    Lit,
    /// Any other character.
    Punct(char),
}

#[derive(Debug, Clone)]
pub struct Token {
    pub tok: Tok,
    pub line: usize,
}

impl Token {
    pub fn is_word(&self, w: &str) -> bool {
        matches!(&self.tok, Tok::Word(x) if x == w)
    }

    pub fn is(&self, c: char) -> bool {
        self.tok == Tok::Punct(c)
    }

    pub fn word(&self) -> Option<&str> {
        match &self.tok {
            Tok::Word(w) => Some(w),
            _ => None,
        }
    }
}

/// The words of `source`, in order.
pub fn tokens(source: &str) -> Vec<Token> {
    let mut lexer = Lexer {
        c: source.chars().collect(),
        i: 0,
        line: 1,
        out: Vec::new(),
    };
    lexer.run();
    lexer.out
}

struct Lexer {
    c: Vec<char>,
    i: usize,
    line: usize,
    out: Vec<Token>,
}

fn is_word_char(ch: char) -> bool {
    ch.is_alphanumeric() || ch == '_'
}

impl Lexer {
    fn at(&self, k: usize) -> char {
        self.c.get(self.i + k).copied().unwrap_or('\0')
    }

    fn push(&mut self, tok: Tok, line: usize) {
        self.out.push(Token { tok, line });
    }

    /// Steps over one character, counting lines.
    fn step(&mut self) {
        if self.at(0) == '\n' {
            self.line += 1;
        }
        self.i += 1;
    }

    fn run(&mut self) {
        while self.i < self.c.len() {
            let (ch, next) = (self.at(0), self.at(1));
            if ch.is_whitespace() {
                self.step();
            } else if ch == '/' && next == '/' {
                while self.i < self.c.len() && self.at(0) != '\n' {
                    self.i += 1;
                }
            } else if ch == '/' && next == '*' {
                self.block_comment();
            } else if ch == '"' {
                self.string(0);
            } else if let Some(hashes) = self.raw_string_start() {
                self.string(hashes);
            } else if ch == '\'' {
                self.quote();
            } else if ch == ':' && next == ':' {
                self.push(Tok::Sep, self.line);
                self.i += 2;
            } else if is_word_char(ch) {
                let start = self.i;
                while self.i < self.c.len() && is_word_char(self.at(0)) {
                    self.i += 1;
                }
                let word = self.c[start..self.i].iter().collect();
                self.push(Tok::Word(word), self.line);
            } else {
                self.push(Tok::Punct(ch), self.line);
                self.i += 1;
            }
        }
    }

    fn block_comment(&mut self) {
        let mut depth = 0;
        while self.i < self.c.len() {
            if self.at(0) == '/' && self.at(1) == '*' {
                depth += 1;
                self.i += 2;
            } else if self.at(0) == '*' && self.at(1) == '/' {
                depth -= 1;
                self.i += 2;
                if depth == 0 {
                    return;
                }
            } else {
                self.step();
            }
        }
    }

    /// At `r"`, `r#"`, `br##"` and the like (not inside a longer word): how many
    /// `#` the string is fenced with, the lexer moved onto its `"`.
    fn raw_string_start(&mut self) -> Option<usize> {
        if self.i > 0 && is_word_char(self.c[self.i - 1]) {
            return None;
        }
        let r = match (self.at(0), self.at(1)) {
            ('r', _) => 1,
            ('b' | 'c', 'r') => 2,
            _ => return None,
        };
        let mut k = r;
        while self.at(k) == '#' {
            k += 1;
        }
        if self.at(k) != '"' {
            return None;
        }
        self.i += k;
        Some(k - r)
    }

    /// A string from its opening `"`: escapes count when it is not raw, the
    /// closing `"` must be followed by `hashes` `#` when it is.
    fn string(&mut self, hashes: usize) {
        let line = self.line;
        self.i += 1;
        while self.i < self.c.len() {
            match self.at(0) {
                '\\' if hashes == 0 && self.at(1) != '\n' => self.i += 2,
                '"' if (1..=hashes).all(|k| self.at(k) == '#') => {
                    self.i += 1 + hashes;
                    break;
                }
                _ => self.step(),
            }
        }
        self.push(Tok::Lit, line);
    }

    /// A character literal (`'a'`, `'\n'`, `'\u{1F600}'`) or a lifetime's quote.
    fn quote(&mut self) {
        if self.at(1) == '\\' {
            self.i += 3;
            while self.i < self.c.len() && self.at(0) != '\'' {
                self.i += 1;
            }
            self.i += 1;
            self.push(Tok::Lit, self.line);
        } else if self.at(2) == '\'' {
            self.i += 3;
            self.push(Tok::Lit, self.line);
        } else {
            self.push(Tok::Punct('\''), self.line);
            self.i += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(source: &str) -> Vec<String> {
        tokens(source)
            .into_iter()
            .map(|t| match t.tok {
                Tok::Word(w) => w,
                Tok::Sep => "::".into(),
                Tok::Lit => "LIT".into(),
                Tok::Punct(c) => c.to_string(),
            })
            .collect()
    }

    #[test]
    fn comments_and_literals_hide_what_looks_like_code() {
        let source = r####"
            // use crate::a;
            /* use crate::b; /* nested */ use crate::c; */
            let s = "use crate::d; \" still";
            let r = r#"use crate::e; " still"#;
            let c = '"'; let e = '\''; let l: &'a str = x;
            use crate::f;
        "####;
        let w = words(source).join(" ");
        assert_eq!(
            w,
            "let s = LIT ; let r = LIT ; let c = LIT ; let e = LIT ; \
             let l : & ' a str = x ; use crate :: f ;"
        );
        let lines: Vec<usize> = tokens(source).iter().map(|t| t.line).collect();
        assert_eq!(lines.last(), Some(&7));
    }
}
