//! Typed errors of the blob service, with messages an operator can act on.
//!
//! Every error names the operation and the blob (`container/name`, never a URL, so a
//! SAS signature can never leak into a message) and keeps the HTTP status and the
//! `x-ms-error-code` so callers can decide by code rather than by text.

use std::fmt;
use std::time::Duration;

use thiserror::Error;

use crate::azure::text::{escape_controls, service_text};

/// The REST operation that failed; used in messages and statistics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    CreateBlob,
    GetProperties,
    Read,
    PutPage,
    ClearPages,
    GetPageRanges,
    AcquireLease,
    RenewLease,
    ChangeLease,
    ReleaseLease,
    BreakLease,
    Snapshot,
    ListBlobs,
    Delete,
    SetMetadata,
    SetProperties,
    Copy,
    CreateContainer,
    ContainerProperties,
}

impl Op {
    /// Every operation, in declaration order (`op as usize` indexes it).
    pub const ALL: [Op; 19] = [
        Op::CreateBlob,
        Op::GetProperties,
        Op::Read,
        Op::PutPage,
        Op::ClearPages,
        Op::GetPageRanges,
        Op::AcquireLease,
        Op::RenewLease,
        Op::ChangeLease,
        Op::ReleaseLease,
        Op::BreakLease,
        Op::Snapshot,
        Op::ListBlobs,
        Op::Delete,
        Op::SetMetadata,
        Op::SetProperties,
        Op::Copy,
        Op::CreateContainer,
        Op::ContainerProperties,
    ];

    /// The operation's name in metrics: the REST operation, in snake case.
    pub fn metric_name(self) -> &'static str {
        match self {
            Op::CreateBlob => "put_blob",
            Op::GetProperties => "get_blob_properties",
            Op::Read => "get_blob",
            Op::PutPage => "put_page",
            Op::ClearPages => "clear_pages",
            Op::GetPageRanges => "get_page_ranges",
            Op::AcquireLease => "acquire_lease",
            Op::RenewLease => "renew_lease",
            Op::ChangeLease => "change_lease",
            Op::ReleaseLease => "release_lease",
            Op::BreakLease => "break_lease",
            Op::Snapshot => "snapshot_blob",
            Op::ListBlobs => "list_blobs",
            Op::Delete => "delete_blob",
            Op::SetMetadata => "set_blob_metadata",
            Op::SetProperties => "set_blob_properties",
            Op::Copy => "copy_blob",
            Op::CreateContainer => "create_container",
            Op::ContainerProperties => "get_container_properties",
        }
    }

    /// Whether the operation only reads (a read-only role suffices for it).
    pub fn is_read(self) -> bool {
        matches!(
            self,
            Op::GetProperties
                | Op::Read
                | Op::GetPageRanges
                | Op::ListBlobs
                | Op::ContainerProperties
        )
    }
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = match self {
            Op::CreateBlob => "create",
            Op::GetProperties => "get properties of",
            Op::Read => "read",
            Op::PutPage => "write pages to",
            Op::ClearPages => "clear pages of",
            Op::GetPageRanges => "get page ranges of",
            Op::AcquireLease => "acquire lease on",
            Op::RenewLease => "renew lease on",
            Op::ChangeLease => "change lease on",
            Op::ReleaseLease => "release lease on",
            Op::BreakLease => "break lease on",
            Op::Snapshot => "snapshot",
            Op::ListBlobs => "list blobs in",
            Op::Delete => "delete",
            Op::SetMetadata => "set metadata on",
            Op::SetProperties => "set properties of",
            Op::Copy => "copy onto",
            Op::CreateContainer => "create container",
            Op::ContainerProperties => "get properties of container",
        };
        f.write_str(s)
    }
}

/// A failure talking to the blob service.
#[derive(Debug, Error)]
pub enum AzureError {
    /// The service answered with an error status.
    #[error("{}", service_message(*op, target, *status, code.as_deref(), message.as_deref(), denied.as_deref()))]
    Service {
        op: Op,
        target: String,
        status: u16,
        code: Option<String>,
        message: Option<String>,
        /// What a 403 means for this credential, when the credential knows better
        /// than the generic "key or SAS" advice (an Entra ID identity lacking a
        /// role, say).
        denied: Option<String>,
    },
    /// No answer within the retry budget (connection refused, reset, timed out).
    /// `endpoint` is the blob service URL tried, without query or credentials.
    #[error("cannot {op} {target}: no answer from the storage service at {endpoint} after {attempts} attempt(s) in {:.1}s ({})", elapsed.as_secs_f64(), escape_controls(detail))]
    Unreachable {
        op: Op,
        target: String,
        endpoint: String,
        detail: String,
        attempts: u32,
        elapsed: Duration,
    },
    /// The server's TLS certificate is not trusted: final, nothing was sent.
    /// `detail` names the host, the reason and how to trust a CA.
    #[error("cannot {op} {target}: {detail}")]
    Certificate {
        op: Op,
        target: String,
        detail: String,
    },
    /// The request could not be authorised, so it was not sent: the credential
    /// has no valid token (an Entra ID token that expired while its renewal keeps
    /// failing). An outage of the identity service, waited out like one.
    #[error("cannot {op} {target}: {}", escape_controls(detail))]
    NotAuthorized {
        op: Op,
        target: String,
        detail: String,
    },
    /// The request was refused by the client itself; nothing was sent.
    #[error("cannot {op} {target}: {reason}")]
    Invalid {
        op: Op,
        target: String,
        reason: String,
    },
    /// Answers came within the retry budget, but the latest was not the answer
    /// asked for (another range, a body cut short or not whole in time, a bad
    /// CRC64, a page list that is none, an encoding never asked for): something
    /// on the path to the service changes them. None was used. It says the path
    /// is broken, not the request wrong, so it is waited out like an outage,
    /// while named for what it is. The detail may quote the answer.
    #[error("cannot {op} {target}: answers from the storage service at {endpoint} came garbled, none used: {} (the latest of {attempts} attempt(s) in {:.1}s)", escape_controls(detail), elapsed.as_secs_f64())]
    Garbled {
        op: Op,
        target: String,
        endpoint: String,
        detail: String,
        attempts: u32,
        elapsed: Duration,
    },
    /// The service answered something the client cannot make sense of. The
    /// detail may quote the answer, so it is printed with controls escaped.
    #[error(
        "cannot {op} {target}: unexpected response: {}",
        escape_controls(detail)
    )]
    Protocol {
        op: Op,
        target: String,
        detail: String,
    },
}

/// Lease codes meaning "someone else now controls this blob's lease".
const LEASE_LOST_CODES: [&str; 4] = [
    "LeaseIdMismatchWithBlobOperation",
    "LeaseNotPresentWithBlobOperation",
    "LeaseLost",
    "LeaseIdMismatchWithLeaseOperation",
];

impl AzureError {
    /// HTTP status of a service error.
    pub fn status(&self) -> Option<u16> {
        match self {
            AzureError::Service { status, .. } => Some(*status),
            _ => None,
        }
    }

    /// The service's `x-ms-error-code`, if any.
    pub fn code(&self) -> Option<&str> {
        match self {
            AzureError::Service { code, .. } => code.as_deref(),
            _ => None,
        }
    }

    /// True when the lease this client held is gone: writes must stop.
    pub fn is_lease_lost(&self) -> bool {
        match self {
            AzureError::Service {
                status: 412 | 409,
                code: Some(c),
                ..
            } => LEASE_LOST_CODES.contains(&c.as_str()),
            _ => false,
        }
    }

    /// True when the request may or may not have been carried out: no answer came
    /// (timeout, broken connection), only garbled ones (one may have said the work
    /// was done), or a server error that can follow the work.
    ///
    /// A 503 `ServerBusy` is the one retryable answer that says the request was
    /// not carried out: the service throttles a request before it runs. Counting it
    /// as unknown would make every throttled write raise the write fence (one more
    /// request to the same blob) right when the blob is over its request target.
    pub fn outcome_unknown(&self) -> bool {
        self.is_transient() && !self.is_throttled()
    }

    /// True when trying again later may succeed: no answer, only garbled
    /// answers, a server error, or throttling. An I/O waits through these as
    /// through an outage.
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            AzureError::Unreachable { .. } | AzureError::Garbled { .. }
        ) || self
            .status()
            .is_some_and(crate::azure::retry::is_retryable_status)
    }

    /// True for 503 `ServerBusy`: the blob or account is over its scalability
    /// target and the request was refused before it ran.
    pub fn is_throttled(&self) -> bool {
        self.status() == Some(503) && self.code() == Some("ServerBusy")
    }

    /// True when waiting may help: the service did not answer, its answers came
    /// garbled, it failed internally or throttled, or no token could be had yet
    /// (its renewal keeps failing). Mounts wait through these up to their I/O
    /// timeout.
    pub fn is_outage(&self) -> bool {
        self.is_transient() || matches!(self, AzureError::NotAuthorized { .. })
    }

    /// True when the answers came but none could be used: an outage that is
    /// not a silence, and must not be called one.
    pub fn is_garbled(&self) -> bool {
        matches!(self, AzureError::Garbled { .. })
    }

    /// True for 404 of any kind.
    pub fn is_not_found(&self) -> bool {
        self.status() == Some(404)
    }

    /// True when a request sent on the condition of the blob's ETag (`If-Match`)
    /// was refused because the blob has changed since (412 `ConditionNotMet`):
    /// nothing was done.
    pub fn is_changed_since_read(&self) -> bool {
        self.code() == Some("ConditionNotMet")
    }
}

fn service_message(
    op: Op,
    target: &str,
    status: u16,
    code: Option<&str>,
    message: Option<&str>,
    denied: Option<&str>,
) -> String {
    let code_s = code.unwrap_or("");
    let hint = match (status, code_s) {
        (403, _) if denied.is_some() => denied.map(str::to_string),
        (403, _) => Some(
            "access denied: the account key or SAS is wrong, expired or lacks permission, or this machine's clock is off"
                .to_string(),
        ),
        (404, "ContainerNotFound") => {
            let container = target.split('/').next().unwrap_or(target);
            Some(format!("container '{container}' does not exist"))
        }
        (404, "BlobNotFound") => Some(format!("blob '{target}' does not exist")),
        (404, "") => Some(format!("'{target}' does not exist")),
        (409, "LeaseAlreadyPresent") => Some(format!(
            "the drive is in use: another client holds the lease on '{target}' (mounted elsewhere?); if that host is dead, run `blobdrive lease break {target} --yes`"
        )),
        (412, "LeaseIdMissing") => Some(format!(
            "the drive is in use: '{target}' is leased by another client (mounted?); unmount it first, or if that host is dead run `blobdrive lease break {target} --yes`"
        )),
        (409 | 412, c) if LEASE_LOST_CODES.contains(&c) => Some(format!(
            "the lease on '{target}' was lost ({c}): another client broke or took over the drive; writing stopped"
        )),
        (409, "LeaseNotPresentWithLeaseOperation") => {
            Some(format!("'{target}' has no active lease"))
        }
        (409, "BlobAlreadyExists") => Some(format!(
            "blob '{target}' already exists; blobdrive never replaces an existing blob"
        )),
        (409, "ContainerAlreadyExists") => Some(format!("container '{target}' already exists")),
        (409, "SnapshotsPresent") => Some(format!(
            "'{target}' has snapshots; add --snapshots to delete them together with the blob"
        )),
        (409, "SnapshotOperationRateExceeded") => {
            Some("too many snapshots taken of this blob in a short time; try again later".to_string())
        }
        (413, _) => Some("request body too large (Put Page takes at most 4 MiB)".to_string()),
        (416, _) => Some("page range not valid (must be 512-byte aligned and inside the blob)".to_string()),
        // Container names are checked before anything is sent, so this is almost
        // always an endpoint whose path lacks the account (or has extra segments).
        (400, "InvalidResourceName") => Some(format!(
            "the service refused the container or blob name in the request for '{target}': if BlobEndpoint is an emulator or an IP address, it must be http://HOST:PORT/ACCOUNT (e.g. http://127.0.0.1:10000/devstoreaccount1); otherwise the blob name may be too long"
        )),
        (400, "InvalidHeaderValue") => Some(
            "the service rejected a header (an emulator too old for API version 2021-12-02?)".to_string(),
        ),
        _ => None,
    };
    // The code and the message are the service's words: escaped and cut.
    let code = code.map(service_text);
    let message = message.map(service_text);
    let detail = match (code, message) {
        (Some(c), Some(m)) => format!("HTTP {status} {c}: {m}"),
        (Some(c), None) => format!("HTTP {status} {c}"),
        (None, Some(m)) => format!("HTTP {status}: {m}"),
        (None, None) => format!("HTTP {status}"),
    };
    match hint {
        Some(h) => format!("cannot {op} {target}: {h} ({detail})"),
        None => format!("cannot {op} {target}: {detail}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn svc(status: u16, code: Option<&str>) -> AzureError {
        AzureError::Service {
            op: Op::PutPage,
            target: "disks/a.vhd".into(),
            status,
            code: code.map(str::to_string),
            message: Some("Some text.\nRequestId:1\nTime:2".into()),
            denied: None,
        }
    }

    #[test]
    fn every_operation_is_listed_at_its_own_index() {
        for (i, op) in Op::ALL.iter().enumerate() {
            assert_eq!(*op as usize, i, "{op:?}");
        }
    }

    #[test]
    fn messages_are_one_line_and_helpful() {
        let m = svc(403, Some("AuthenticationFailed")).to_string();
        assert!(m.contains("account key or SAS"), "{m}");
        assert!(!m.contains('\n'));
        let m = svc(404, Some("ContainerNotFound")).to_string();
        assert!(m.contains("container 'disks' does not exist"), "{m}");
        let m = svc(409, Some("LeaseAlreadyPresent")).to_string();
        assert!(m.contains("in use") && m.contains("lease break"), "{m}");
        let m = svc(400, Some("InvalidResourceName")).to_string();
        assert!(
            m.contains("BlobEndpoint")
                && m.contains("http://HOST:PORT/ACCOUNT")
                && m.contains("HTTP 400 InvalidResourceName"),
            "{m}"
        );
    }

    #[test]
    fn a_hostile_code_and_message_are_escaped_and_cut() {
        let e = AzureError::Service {
            op: Op::Read,
            target: "disks/a.vhd".into(),
            status: 500,
            code: Some("\x1b]0;title\x07".into()),
            message: Some(format!("\x1b[2J{}", "y".repeat(10_000))),
            denied: None,
        };
        let m = e.to_string();
        assert!(!m.chars().any(|c| c.is_control()), "{m:?}");
        assert!(m.contains("\\u{1b}]0;title"), "{m}");
        assert!(m.len() < 1000, "{} characters", m.len());
    }

    #[test]
    fn answers_garbled_after_the_budget_are_an_outage_named_for_what_it_is() {
        let e = AzureError::Garbled {
            op: Op::PutPage,
            target: "disks/a.vhd".into(),
            endpoint: "http://127.0.0.1:10000/devstoreaccount1".into(),
            detail: "the answer came encoded (gzip)\n, which was never asked for".into(),
            attempts: 6,
            elapsed: Duration::from_secs(4),
        };
        assert!(e.is_outage() && e.is_transient() && e.is_garbled());
        // One may have said the write was done.
        assert!(e.outcome_unknown());
        let m = e.to_string();
        assert!(
            m.contains("came garbled, none used") && m.contains("6 attempt(s)"),
            "{m}"
        );
        assert!(!m.contains("no answer") && !m.contains('\n'), "{m}");
    }

    #[test]
    fn lease_lost_classification() {
        assert!(svc(412, Some("LeaseIdMismatchWithBlobOperation")).is_lease_lost());
        assert!(svc(412, Some("LeaseNotPresentWithBlobOperation")).is_lease_lost());
        assert!(!svc(412, Some("LeaseIdMissing")).is_lease_lost());
        assert!(!svc(500, None).is_lease_lost());
    }
}
