//! The channel between the worker and the root part: a socketpair made before the
//! fork, one request line and one answer line at a time, each a JSON object of at
//! most [`LINE_MAX`] bytes. Whatever is not one of the requests below, exactly,
//! is refused; a line longer than the bound ends the conversation (its framing
//! can no longer be trusted).

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;

use serde::{Deserialize, Serialize};
use thiserror::Error;

use super::log::QUOTE_MAX;
use crate::mount::MountError;

/// The longest line either side reads: far above any request's size (a few
/// status words, the warnings of a mount), far below what could hurt the
/// reader.
pub const LINE_MAX: usize = 64 * 1024;

/// What the worker asks of the root part. None carries a path or a device: the
/// root part decided those itself before the fork, and acts only on them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
pub enum Request {
    /// The drive serves: tell `blobdrive mount` (and the service manager, with
    /// `status`) and add libmount's entry for the mountpoint. The warnings and
    /// notes are the worker's, shown to the user as they are.
    Ready {
        status: String,
        #[serde(default)]
        warnings: Vec<String>,
        #[serde(default)]
        notes: Vec<String>,
        /// How the worker signed in (`Credential::describe`), for the record:
        /// the root part named the account only.
        #[serde(default)]
        auth: Option<String>,
    },
    /// The mount failed (the worker undid what it did): tell `blobdrive mount`.
    Failed {
        message: String,
    },
    /// A `STATUS=` line for the service manager.
    Status {
        line: String,
    },
    /// `STOPPING=1` with a status line.
    Stopping {
        line: String,
    },
    /// Unmount the FUSE mount (lazily: even while busy).
    UmountFuse {
        lazy: bool,
    },
    /// The processes that hold the FUSE file `disk` open. (Empty braces, here
    /// and below: serde checks for unknown fields only in a variant that has
    /// braces, and a request with a field it does not have must be refused.)
    Holders {},
    /// The drive is down: release the record (leaving `losses`, if any, for
    /// `blobdrive unmount`), and the log too when nothing was lost.
    Finished {
        losses: Vec<String>,
    },
    /// The drive came down cleanly: its log is of no more use.
    RemoveLog {},
    /// Attach a loop device over the FUSE file `disk` (opened by the root part
    /// beneath its own FUSE mount, a regular file of it, never through a
    /// symlink), set up for a disk across a network (read-ahead, direct I/O
    /// and, when writable, a writeback limit), read-only when the mount is:
    /// answered with the device's path, which the record and `Ready` then name.
    /// `block_size`: the device's logical block size, 512 or 4096 (an
    /// encrypted drive's sector size), anything else refused. Refused in raw
    /// mode.
    AttachLoop {
        block_size: u32,
    },
    /// Whether the loop device is still attached over `disk` (the kernel's
    /// disk sequence number of it is the one read right after attaching):
    /// after a plain umount with autoclear it is not, and the root part
    /// forgets it.
    LoopAttached {},
    /// Make the loop device take the new size of `disk` (after a resize):
    /// answered with the device's size in bytes.
    LoopCapacity {},
    /// The size of `disk` as the kernel sees it (a stat of it, opened as
    /// `AttachLoop` opens it: the FUSE mount lets root alone in): answered with
    /// its size in bytes.
    DiskSize {},
    /// Detach the loop device (and put its writeback settings back); refused
    /// while the filesystem on it is mounted.
    DetachLoop {},
    /// Find the filesystem on the loop device, or make the one the mount asked
    /// for (`--mkfs`) when it holds none; refused unless blobdrive mounts it.
    /// `zeroed`: no byte of the drive was ever written (see `system::mkfs`):
    /// at worst, a worker that lies about it has ext4 skip zeroing inode tables
    /// on the disk whose every byte it serves anyway.
    PrepareFs {
        zeroed: bool,
    },
    /// Mount the filesystem found by `PrepareFs` at the mount's directory, and
    /// set the loop device to detach itself when it is unmounted. `small`: the
    /// filesystem's and the disk's sizes when the worker read from its
    /// superblock that it is smaller than its disk: it is grown to fill it.
    MountFs {
        small: Option<(u64, u64)>,
    },
    /// Whether any mount has the loop device as its source (a plain umount of
    /// the filesystem has begun once none has, while the device is attached).
    LoopMounted {},
    /// Unmount the filesystem at the mount's directory (lazily: even while
    /// busy), if it is still the one mounted there.
    UmountFs {
        lazy: bool,
    },
    /// Freeze the filesystem (for a consistent snapshot) until `Thaw`; thawed
    /// by the root part when the worker dies first.
    Freeze {},
    Thaw {},
    /// Whether the root part may grow a mounted ext4 (`CAP_SYS_RESOURCE`).
    CanGrowMountedExt4 {},
    /// Grow the mounted filesystem to fill its device (after `LoopCapacity`):
    /// answered with its size in bytes.
    GrowFs {},
    /// The text of the federated token file (workload identity), read afresh:
    /// the file the root part's own environment names
    /// (`AZURE_FEDERATED_TOKEN_FILE`), never one the worker could choose.
    /// kubelet's token directories may be root's alone, and Landlock keeps the
    /// worker out of them anyway. Answered with [`Answer::Text`], at most
    /// `TOKEN_FILE_MAX` bytes.
    FederatedToken {},
}

/// The root part's answer to one request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum Answer {
    Done,
    /// An answer that is a list (the holders of `disk`).
    Lines(Vec<String>),
    /// The loop device attached (`/dev/loopN`).
    Device(String),
    /// Whether the loop device is still attached over `disk`.
    Attached(bool),
    /// A size in bytes.
    Size(u64),
    /// A yes or no.
    Flag(bool),
    /// The filesystem found (or made) by `PrepareFs`.
    Prepared {
        fstype: String,
        formatted: bool,
        warnings: Vec<String>,
    },
    /// What `MountFs` did besides mounting.
    MountedFs {
        autoclear: bool,
        notes: Vec<String>,
        warnings: Vec<String>,
    },
    /// Not done: what it acts on is in use; everything stays as it was.
    Busy(String),
    /// Not done, for the reason given.
    Failed(String),
    /// Not a request the root part takes.
    Refused(String),
    /// A file's text (the federated token).
    Text(String),
    /// Still under way, after the longest the root part waits before it
    /// answers (the kernel waits on the worker's FUSE answers for it): ask
    /// again to wait on, or for its answer.
    Pending(String),
}

/// Why the channel failed.
#[derive(Debug, Error)]
pub enum ChannelError {
    #[error("the channel to the root part failed: {0}")]
    Io(#[from] std::io::Error),
    #[error("a line longer than {LINE_MAX} bytes on the channel between the mount's processes")]
    TooLong,
    #[error("a line that is not UTF-8 on the channel between the mount's processes")]
    NotUtf8,
    #[error("an answer the worker cannot read on the channel between the mount's processes: {0}")]
    Malformed(String),
    #[error("the other process of the mount closed the channel")]
    Closed,
}

impl From<ChannelError> for MountError {
    fn from(e: ChannelError) -> MountError {
        MountError::system(e.to_string())
    }
}

/// Reads one line of at most [`LINE_MAX`] bytes (without its newline); `None`
/// at the end of the stream. A longer line is an error and is not read on.
pub fn read_line<R: BufRead>(r: &mut R) -> Result<Option<String>, ChannelError> {
    let mut line = Vec::new();
    loop {
        let buf = r.fill_buf()?;
        if buf.is_empty() {
            return if line.is_empty() {
                Ok(None)
            } else {
                Err(ChannelError::Closed)
            };
        }
        let (take, end) = match buf.iter().position(|&b| b == b'\n') {
            Some(i) => (i, true),
            None => (buf.len(), false),
        };
        if line.len() + take > LINE_MAX {
            return Err(ChannelError::TooLong);
        }
        line.extend_from_slice(&buf[..take]);
        r.consume(take + usize::from(end));
        if end {
            return String::from_utf8(line)
                .map(Some)
                .map_err(|_| ChannelError::NotUtf8);
        }
    }
}

/// Writes `value` as one JSON line (JSON escapes every newline inside it).
fn write_line<T: Serialize>(w: &mut impl Write, value: &T) -> Result<(), ChannelError> {
    let mut line = serde_json::to_vec(value).map_err(|e| ChannelError::Malformed(e.to_string()))?;
    if line.len() > LINE_MAX {
        return Err(ChannelError::TooLong);
    }
    line.push(b'\n');
    w.write_all(&line)?;
    w.flush()?;
    Ok(())
}

/// Sends `req` on `conn` and reads its answer.
pub(super) fn exchange(
    conn: &mut BufReader<UnixStream>,
    req: &Request,
) -> Result<Answer, ChannelError> {
    write_line(conn.get_mut(), req)?;
    let line = read_line(conn)?.ok_or(ChannelError::Closed)?;
    serde_json::from_str(&line).map_err(|e| ChannelError::Malformed(e.to_string()))
}

/// What the root part does for each request: [`answer_one`] reads, checks and
/// answers; this carries out.
pub trait Ops {
    fn carry_out(&mut self, req: Request) -> Answer;

    /// A line that is not one of the requests, refused: `why` is the parser's
    /// reason, which quotes the line (the answer quotes only the start of it,
    /// [`QUOTE_MAX`] characters, as the root part's own messages do).
    fn refuse(&mut self, why: &str) -> Answer {
        let start: String = why.chars().take(QUOTE_MAX).collect();
        Answer::Refused(format!("not a request the root part takes ({start})"))
    }
}

/// Reads one request from `conn` and answers it. `Ok(false)` at the end of the
/// stream; an error when the peer broke the framing (a line too long, not
/// UTF-8): the conversation is over then. A line that is not exactly one of the
/// [`Request`]s is refused and the conversation goes on.
pub fn answer_one<O: Ops>(
    conn: &mut BufReader<UnixStream>,
    ops: &mut O,
) -> Result<bool, ChannelError> {
    let Some(line) = read_line(conn)? else {
        return Ok(false);
    };
    let answer = match serde_json::from_str::<Request>(&line) {
        Ok(req) => ops.carry_out(req),
        Err(e) => ops.refuse(&e.to_string()),
    };
    write_line(conn.get_mut(), &answer)?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::super::client::RootClient;
    use super::*;
    use std::io::Read;

    /// Records what it was asked and answers as told.
    struct Fake {
        asked: Vec<Request>,
    }

    impl Ops for Fake {
        fn carry_out(&mut self, req: Request) -> Answer {
            let answer = match &req {
                Request::Holders {} => Answer::Lines(vec!["cat (pid 7)".into()]),
                Request::UmountFuse { lazy: false } => Answer::Busy("/mnt/x".into()),
                Request::AttachLoop { .. } => Answer::Device("/dev/loop7".into()),
                Request::LoopAttached {} => Answer::Attached(true),
                Request::LoopCapacity {} | Request::DiskSize {} => Answer::Size(1 << 20),
                Request::DetachLoop {} => Answer::Failed("still in use".into()),
                Request::FederatedToken {} => Answer::Text("eyJ.token.sig\n".into()),
                // Still under way the first two times it is asked.
                Request::GrowFs {} if self.asked.iter().filter(|r| **r == req).count() < 2 => {
                    Answer::Pending("grow_fs".into())
                }
                Request::GrowFs {} => Answer::Size(3 << 20),
                _ => Answer::Done,
            };
            self.asked.push(req);
            answer
        }
    }

    /// How the fake root part's conversation ended, and what it was asked.
    type Served = std::thread::JoinHandle<(Result<(), ChannelError>, Vec<Request>)>;

    /// A root part serving `fake` on a thread until the worker's end closes or
    /// breaks the framing.
    fn root_part() -> (UnixStream, Served) {
        let (worker, root) = UnixStream::pair().unwrap();
        let served = std::thread::spawn(move || {
            let mut fake = Fake { asked: Vec::new() };
            let mut conn = BufReader::new(root);
            let result = loop {
                match answer_one(&mut conn, &mut fake) {
                    Ok(true) => continue,
                    Ok(false) => break Ok(()),
                    Err(e) => break Err(e),
                }
            };
            (result, fake.asked)
        });
        (worker, served)
    }

    #[test]
    fn requests_go_across_and_answers_come_back() {
        let (worker, served) = root_part();
        let client = RootClient::new(worker);
        client
            .done(&Request::Ready {
                status: "serving".into(),
                warnings: vec!["w\nwith a newline".into()],
                notes: Vec::new(),
                auth: None,
            })
            .unwrap();
        assert_eq!(client.holders(), vec!["cat (pid 7)".to_string()]);
        assert!(matches!(
            client.umount_fuse(false),
            Err(MountError::Busy(p)) if p == "/mnt/x"
        ));
        client.umount_fuse(true).unwrap();
        assert_eq!(client.attach_loop(4096).unwrap(), "/dev/loop7");
        assert_eq!(client.loop_attached(), Some(true));
        assert_eq!(client.loop_capacity().unwrap(), 1 << 20);
        assert_eq!(client.disk_size().unwrap(), 1 << 20);
        assert!(matches!(
            client.detach_loop(),
            Err(MountError::System { .. })
        ));
        assert_eq!(client.federated_token().unwrap(), "eyJ.token.sig\n");
        // Pending twice: asked again until it is done.
        assert_eq!(client.grow_fs().unwrap(), 3 << 20);
        drop(client);
        let (result, asked) = served.join().unwrap();
        result.unwrap();
        assert_eq!(asked.len(), 13);
        assert_eq!(
            asked[0],
            Request::Ready {
                status: "serving".into(),
                warnings: vec!["w\nwith a newline".into()],
                notes: Vec::new(),
                auth: None,
            }
        );
    }

    /// Sends raw bytes as a hostile worker would, and reads the answer line.
    fn raw(worker: &mut UnixStream, bytes: &[u8]) -> String {
        worker.write_all(bytes).unwrap();
        let mut answer = Vec::new();
        let mut byte = [0u8; 1];
        while worker.read(&mut byte).unwrap() == 1 && byte[0] != b'\n' {
            answer.push(byte[0]);
        }
        String::from_utf8(answer).unwrap()
    }

    #[test]
    fn a_hostile_worker_is_refused_unknown_requests_and_paths_it_chose() {
        let (mut worker, served) = root_part();
        // Not a request at all.
        let a = raw(&mut worker, b"{\"op\":\"exec\",\"argv\":[\"/bin/sh\"]}\n");
        assert!(a.starts_with("{\"refused\":"), "{a}");
        // A known request with a path of the worker's choosing: requests carry
        // none, and a field the request does not have is refused.
        let a = raw(
            &mut worker,
            b"{\"op\":\"umount_fuse\",\"lazy\":true,\"path\":\"/\"}\n",
        );
        assert!(a.starts_with("{\"refused\":"), "{a}");
        let a = raw(
            &mut worker,
            b"{\"op\":\"holders\",\"of\":\"/etc/shadow\"}\n",
        );
        assert!(a.starts_with("{\"refused\":"), "{a}");
        // The loop device's requests name no file, device or mode (a block
        // size only, a number): the root part attaches its own FUSE file `disk`, as the mount asked, and acts
        // only on the device it attached.
        for hostile in [
            &b"{\"op\":\"attach_loop\",\"file\":\"/etc/shadow\"}\n"[..],
            b"{\"op\":\"attach_loop\",\"read_only\":false}\n",
            b"{\"op\":\"attach_loop\",\"block_size\":4096,\"file\":\"/etc/shadow\"}\n",
            b"{\"op\":\"attach_loop\",\"block_size\":-1}\n",
            b"{\"op\":\"loop_attached\",\"device\":\"/dev/sda\"}\n",
            b"{\"op\":\"loop_capacity\",\"device\":\"/dev/loop0\"}\n",
            b"{\"op\":\"disk_size\",\"of\":\"/etc/shadow\"}\n",
            b"{\"op\":\"detach_loop\",\"device\":\"/dev/loop0\"}\n",
            b"{\"op\":\"detach_loop\",\"lazy\":true}\n",
            // The federated token's file is the one the root part's own
            // environment names: the worker names none.
            b"{\"op\":\"federated_token\",\"path\":\"/etc/shadow\"}\n",
            b"{\"op\":\"federated_token\",\"file\":\"/root/.ssh/id_ed25519\"}\n",
        ] {
            let a = raw(&mut worker, hostile);
            assert!(a.starts_with("{\"refused\":"), "{a}");
        }
        // Not JSON, and a bare string.
        let a = raw(&mut worker, b"umount /\n");
        assert!(a.starts_with("{\"refused\":"), "{a}");
        let a = raw(&mut worker, b"\"holders\"\n");
        assert!(a.starts_with("{\"refused\":"), "{a}");
        // Still serving: a proper request after all that is carried out.
        let a = raw(&mut worker, b"{\"op\":\"holders\"}\n");
        assert_eq!(a, "{\"lines\":[\"cat (pid 7)\"]}");
        // A line past the bound ends the conversation without carrying anything
        // out, and without reading it whole.
        let mut long = b"{\"op\":\"status\",\"line\":\"".to_vec();
        long.resize(LINE_MAX + 10, b'x');
        // The root part may close before the last bytes are written.
        let _ = worker.write_all(&long);
        let (result, asked) = served.join().unwrap();
        assert!(matches!(result, Err(ChannelError::TooLong)), "{result:?}");
        assert_eq!(asked, vec![Request::Holders {}]);
    }

    #[test]
    fn lines_are_bounded_and_must_be_utf8() {
        let mut ok = std::io::Cursor::new(b"abc\ndef".to_vec());
        assert_eq!(read_line(&mut ok).unwrap().as_deref(), Some("abc"));
        // A last line without its newline: the peer went away mid-line.
        assert!(matches!(read_line(&mut ok), Err(ChannelError::Closed)));
        let mut empty = std::io::Cursor::new(Vec::new());
        assert!(read_line(&mut empty).unwrap().is_none());
        let mut exact = vec![b'x'; LINE_MAX];
        exact.push(b'\n');
        let got = read_line(&mut std::io::Cursor::new(exact))
            .unwrap()
            .unwrap();
        assert_eq!(got.len(), LINE_MAX);
        let over = vec![b'x'; LINE_MAX + 1];
        // Read through a small buffer: the bound holds across refills.
        let mut r = BufReader::with_capacity(100, std::io::Cursor::new(over));
        assert!(matches!(read_line(&mut r), Err(ChannelError::TooLong)));
        let mut bad = std::io::Cursor::new(b"\xff\xfe\n".to_vec());
        assert!(matches!(read_line(&mut bad), Err(ChannelError::NotUtf8)));
    }
}
