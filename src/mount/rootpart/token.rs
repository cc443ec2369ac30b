//! The federated token of workload identity, read by the root part for the
//! worker from the file its own environment names.

use super::channel::Answer;
use crate::azure::auth::entra::workload_identity::read_token_file;

/// The variable naming workload identity's federated token file.
pub(super) const FEDERATED_TOKEN_FILE_ENV: &str = "AZURE_FEDERATED_TOKEN_FILE";

/// The answer to [`Request::FederatedToken`](super::Request::FederatedToken):
/// the text of `file` (the root part's own `AZURE_FEDERATED_TOKEN_FILE`), read
/// afresh, within the bounds of `read_token_file` (so the answer fits one line
/// of the channel). The path is the platform's, through symlinks (kubelet
/// swaps one to rotate the token); the worker has no say in it.
pub(super) fn federated_token(file: Option<&std::ffi::OsStr>) -> Answer {
    let Some(file) = file.filter(|f| !f.is_empty()) else {
        return Answer::Failed(format!("{FEDERATED_TOKEN_FILE_ENV} is not set"));
    };
    let path = std::path::Path::new(file);
    match read_token_file(path) {
        Ok(text) => Answer::Text(text),
        Err(e) => Answer::Failed(format!("the root part cannot read it: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_federated_token_is_the_named_file_s_text_or_why_not() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("token");
        std::fs::write(&f, "eyJ.a.b\n").unwrap();
        assert_eq!(
            federated_token(Some(f.as_os_str())),
            Answer::Text("eyJ.a.b\n".into())
        );
        let unset = federated_token(None);
        assert!(
            matches!(&unset, Answer::Failed(m) if m.contains("AZURE_FEDERATED_TOKEN_FILE is not set")),
            "{unset:?}"
        );
        assert!(matches!(
            federated_token(Some(std::ffi::OsStr::new(""))),
            Answer::Failed(_)
        ));
        let missing = federated_token(Some(dir.path().join("nope").as_os_str()));
        assert!(
            matches!(&missing, Answer::Failed(m) if m.contains("No such file")),
            "{missing:?}"
        );
        // The largest file it takes, every character one that JSON escapes:
        // the answer still fits one line of the channel.
        std::fs::write(&f, "\"\\\n".repeat(16 * 1024 / 3)).unwrap();
        let answer = federated_token(Some(f.as_os_str()));
        let line = serde_json::to_vec(&answer).unwrap();
        assert!(matches!(answer, Answer::Text(_)));
        assert!(line.len() <= super::super::LINE_MAX, "{}", line.len());
    }
}
