//! Keeps a token fresh for as long as the process lives: [`TokenKeeper`].
//!
//! A thread of its own (with a one-thread async runtime) signs in and then renews
//! the token ahead of its expiry ([`AccessToken::renew_at`]), so requests read the
//! current token without ever waiting on a renewal that is not due. It is a thread
//! rather than a task because the token must outlive any one runtime: the CLI makes
//! a small runtime per command, the mount daemon its own, and the keeper serves
//! both; and the token client's connections stay on the one runtime that drives
//! them.
//!
//! A renewal that fails is tried again with backoff (1 s doubling to 30 s), without
//! end: while the old token lasts nothing is lost; once it has expired, requests
//! fail to authorise with the renewal's error, which the mount treats as an outage
//! (writes wait, `stats` shows the reason). A request the service refused with 401
//! forces a renewal at once ([`TokenKeeper::renew_now`]). Whatever asks, two
//! renewals start at least [`MIN_GAP`] apart: a token endpoint is never asked in
//! a loop, by a service that refuses every token or by tokens that come already
//! expired (which [`super::http::token_from`] refuses as failures).

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime};

use tokio::sync::{watch, Notify};
use tracing::{info, warn};

use super::chain::{self, EntraEnv, SignInError};
use super::{AccessToken, BoxFuture, SourceKind, TokenSource};
use crate::azure::auth::AuthError;

/// A token this close to expiry (or within a quarter of its lifetime, for very
/// short ones) is not sent: it could expire on the way.
const EXPIRY_SKEW: Duration = Duration::from_secs(5);
/// Longest a renewal may take before it counts as failed.
const FETCH_TIMEOUT: Duration = Duration::from_secs(60);
/// Longest the renewal thread sleeps before looking at the wall clock again (a
/// suspended machine's monotonic clock does not see the time it slept).
const MAX_SLEEP: Duration = Duration::from_secs(60);
/// Longest [`TokenKeeper::renew_now`] waits for the renewal it asked for.
const FORCED_WAIT: Duration = Duration::from_secs(30);
/// The least time between the starts of two token requests (the sign-in
/// counting as one): at most three in 15 s, whatever forces them.
pub const MIN_GAP: Duration = Duration::from_secs(5);

/// Holds the current token of one source and renews it in the background.
pub struct TokenKeeper {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for TokenKeeper {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "TokenKeeper({}, <token redacted>)", self.kind())
    }
}

struct Shared {
    source: Arc<dyn TokenSource>,
    state: Mutex<State>,
    /// Wakes the renewal thread to look at `state` again (forced renewal, stop).
    wake: Notify,
    /// Counts renewal attempts (either outcome), for those waiting on one.
    attempts: watch::Sender<u64>,
    /// Renewals that failed, for the metrics (the attempts are counted above).
    failed: std::sync::atomic::AtomicU64,
}

struct State {
    token: AccessToken,
    /// Why the latest renewal failed; `None` once one succeeds.
    last_error: Option<String>,
    failures: u32,
    /// When to try again after a failure.
    retry_at: Option<Instant>,
    /// When the latest token request started (the sign-in's, at first).
    fetched_at: Instant,
    force: bool,
    stop: bool,
}

impl Shared {
    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl TokenKeeper {
    /// Signs in through the chain (see [`chain::sign_in`]) and keeps the token
    /// fresh from then on. Every token request, the first included, is made on the
    /// keeper's own thread and runtime, so no connection of the token client is
    /// ever tied to a runtime that has ended.
    pub fn sign_in(
        env: EntraEnv,
        only: Option<SourceKind>,
    ) -> Result<Arc<TokenKeeper>, SignInError> {
        TokenKeeper::spawn(move || {
            Box::pin(async move {
                let signed = chain::sign_in(&env, only).await?;
                Ok((signed.source, signed.token))
            })
        })
    }

    /// Starts keeping `token`, which `source` just gave.
    pub fn start(source: Arc<dyn TokenSource>, token: AccessToken) -> Arc<TokenKeeper> {
        TokenKeeper::spawn(move || Box::pin(async move { Ok((source, token)) }))
            .expect("nothing to fail")
    }

    /// Starts the renewal thread, which gets the first token with `first`, hands
    /// it back, then renews it for as long as the keeper lives.
    fn spawn<F>(first: F) -> Result<Arc<TokenKeeper>, SignInError>
    where
        F: FnOnce() -> BoxFuture<'static, Result<(Arc<dyn TokenSource>, AccessToken), SignInError>>
            + Send
            + 'static,
    {
        let (tx, rx) = std::sync::mpsc::channel();
        let thread = std::thread::Builder::new()
            .name("blobdrive-token".into())
            .spawn(move || {
                let rt = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(rt) => rt,
                    Err(e) => {
                        let _ = tx.send(Err(SignInError::Setup(format!(
                            "cannot start the token runtime: {e}"
                        ))));
                        return;
                    }
                };
                rt.block_on(async move {
                    let started = Instant::now();
                    let (source, token) = match first().await {
                        Ok(v) => v,
                        Err(e) => {
                            let _ = tx.send(Err(e));
                            return;
                        }
                    };
                    let shared = Arc::new(Shared {
                        source,
                        state: Mutex::new(State {
                            token,
                            last_error: None,
                            failures: 0,
                            retry_at: None,
                            fetched_at: started,
                            force: false,
                            stop: false,
                        }),
                        wake: Notify::new(),
                        attempts: watch::Sender::new(0),
                        failed: std::sync::atomic::AtomicU64::new(0),
                    });
                    if tx.send(Ok(shared.clone())).is_ok() {
                        renew_loop(shared).await;
                    }
                });
            });
        if let Err(e) = thread {
            return Err(SignInError::Setup(format!(
                "cannot start the token thread: {e}"
            )));
        }
        let shared = rx.recv().map_err(|_| {
            SignInError::Setup("the token thread ended before signing in".to_string())
        })??;
        Ok(Arc::new(TokenKeeper { shared }))
    }

    pub fn kind(&self) -> SourceKind {
        self.shared.source.kind()
    }

    /// The current token, if it is still valid; otherwise why there is none
    /// (and the renewal thread is nudged).
    pub fn bearer(&self) -> Result<String, AuthError> {
        let s = self.shared.state();
        let skew = EXPIRY_SKEW.min(s.token.lifetime() / 4);
        if SystemTime::now() + skew < s.token.expires_on {
            return Ok(s.token.secret().to_string());
        }
        let why = match &s.last_error {
            Some(e) => format!(
                "the Entra ID token ({}) expired and renewing it keeps failing: {e}",
                self.kind()
            ),
            None => format!(
                "the Entra ID token ({}) expired and its renewal is under way",
                self.kind()
            ),
        };
        drop(s);
        self.shared.wake.notify_one();
        Err(AuthError(why))
    }

    /// Renewals tried since sign-in, and how many of them failed.
    pub fn renewals(&self) -> (u64, u64) {
        (
            *self.shared.attempts.borrow(),
            self.shared
                .failed
                .load(std::sync::atomic::Ordering::Relaxed),
        )
    }

    /// Why the latest renewal failed, while no later one succeeded.
    pub fn last_error(&self) -> Option<String> {
        self.shared.state().last_error.clone()
    }

    /// Renews now (the service refused the token) and waits for the outcome, up to
    /// 30 s.
    pub async fn renew_now(&self) -> Result<(), AuthError> {
        let mut rx = self.shared.attempts.subscribe();
        let seen = *rx.borrow_and_update();
        self.shared.state().force = true;
        self.shared.wake.notify_one();
        let _ = tokio::time::timeout(FORCED_WAIT, async {
            while *rx.borrow_and_update() == seen {
                if rx.changed().await.is_err() {
                    break;
                }
            }
        })
        .await;
        match self.last_error() {
            None => Ok(()),
            Some(e) => Err(AuthError(format!(
                "renewing the Entra ID token ({}) failed: {e}",
                self.kind()
            ))),
        }
    }
}

impl Drop for TokenKeeper {
    fn drop(&mut self) {
        self.shared.state().stop = true;
        self.shared.wake.notify_one();
    }
}

/// Backoff after `failures` failed renewals in a row.
fn backoff(failures: u32) -> Duration {
    Duration::from_secs(1u64 << failures.saturating_sub(1).min(5)).min(Duration::from_secs(30))
}

/// How long until the next renewal is due: at once when forced, after the
/// backoff after a failure, else at the token's renewal time; never sooner than
/// [`MIN_GAP`] after the latest token request started.
fn until_due(s: &State) -> Duration {
    let due = if s.force {
        Duration::ZERO
    } else if let Some(at) = s.retry_at {
        at.saturating_duration_since(Instant::now())
    } else {
        s.token
            .renew_at()
            .duration_since(SystemTime::now())
            .unwrap_or_default()
    };
    due.max((s.fetched_at + MIN_GAP).saturating_duration_since(Instant::now()))
}

async fn renew_loop(shared: Arc<Shared>) {
    loop {
        let wait = {
            let s = shared.state();
            if s.stop {
                return;
            }
            until_due(&s)
        };
        if !wait.is_zero() {
            tokio::select! {
                _ = tokio::time::sleep(wait.min(MAX_SLEEP)) => {}
                _ = shared.wake.notified() => {}
            }
            // Look again: woken early, or only slept a part of the wait.
            continue;
        }
        let kind = shared.source.kind();
        shared.state().fetched_at = Instant::now();
        let outcome = tokio::time::timeout(FETCH_TIMEOUT, shared.source.fetch())
            .await
            .unwrap_or_else(|_| {
                Err(super::TokenError::Failed(format!(
                    "no token within {} s",
                    FETCH_TIMEOUT.as_secs()
                )))
            });
        {
            let mut s = shared.state();
            s.force = false;
            match outcome {
                Ok(token) => {
                    info!(
                        "renewed the Entra ID token through {kind}; valid for {} s",
                        token.lifetime().as_secs()
                    );
                    s.token = token;
                    s.last_error = None;
                    s.failures = 0;
                    s.retry_at = None;
                }
                Err(e) => {
                    shared
                        .failed
                        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    s.failures += 1;
                    let delay = backoff(s.failures);
                    s.retry_at = Some(Instant::now() + delay);
                    let left = s
                        .token
                        .expires_on
                        .duration_since(SystemTime::now())
                        .unwrap_or_default();
                    warn!(
                            "renewing the Entra ID token through {kind} failed ({} in a row; the current token expires in {} s; next try in {} s): {e}",
                            s.failures,
                            left.as_secs(),
                            delay.as_secs()
                        );
                    s.last_error = Some(e.to_string());
                }
            }
        }
        shared.attempts.send_modify(|n| *n += 1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::azure::auth::entra::{BoxFuture, TokenError};
    use std::sync::atomic::{AtomicU32, Ordering};

    /// Gives tokens living `life`, or fails while `failing` is set.
    #[derive(Debug)]
    struct Scripted {
        life: Duration,
        fetches: AtomicU32,
        failing: std::sync::atomic::AtomicBool,
    }

    impl TokenSource for Scripted {
        fn kind(&self) -> SourceKind {
            SourceKind::ManagedIdentity
        }
        fn fetch(&self) -> BoxFuture<'_, Result<AccessToken, TokenError>> {
            Box::pin(async move {
                let n = self.fetches.fetch_add(1, Ordering::SeqCst) + 1;
                if self.failing.load(Ordering::SeqCst) {
                    return Err(TokenError::Failed("IMDS said no".into()));
                }
                Ok(AccessToken::new(
                    format!("token-{n}"),
                    SystemTime::now() + self.life,
                ))
            })
        }
    }

    fn scripted(life: Duration) -> Arc<Scripted> {
        Arc::new(Scripted {
            life,
            fetches: AtomicU32::new(0),
            failing: Default::default(),
        })
    }

    #[test]
    fn renewal_schedule_is_five_minutes_before_or_half_a_short_life() {
        let now = SystemTime::now();
        let mut t = AccessToken::new("x".into(), now + Duration::from_secs(3600));
        t.obtained = now;
        assert_eq!(t.renew_at(), now + Duration::from_secs(3300));
        let mut t = AccessToken::new("x".into(), now + Duration::from_secs(60));
        t.obtained = now;
        assert_eq!(t.renew_at(), now + Duration::from_secs(30));
    }

    #[test]
    fn renews_at_half_life_in_the_background() {
        let src = scripted(Duration::from_secs(12));
        let first = AccessToken::new(
            "token-0".into(),
            SystemTime::now() + Duration::from_secs(12),
        );
        let keeper = TokenKeeper::start(src.clone(), first);
        assert_eq!(keeper.bearer().unwrap(), "token-0");
        std::thread::sleep(Duration::from_millis(6600));
        assert_eq!(src.fetches.load(Ordering::SeqCst), 1);
        assert_eq!(keeper.bearer().unwrap(), "token-1");
        drop(keeper);
    }

    #[tokio::test]
    async fn failing_renewals_are_reported_and_a_forced_one_recovers() {
        let src = scripted(Duration::from_secs(3600));
        src.failing.store(true, Ordering::SeqCst);
        // Already expired: every request is refused until a renewal works.
        let first = AccessToken::new("old".into(), SystemTime::now());
        let keeper = TokenKeeper::start(src.clone(), first);
        let e = keeper.renew_now().await.unwrap_err();
        assert!(e.to_string().contains("IMDS said no"), "{e}");
        let e = keeper.bearer().unwrap_err().to_string();
        assert!(
            e.contains("expired and renewing it keeps failing: IMDS said no"),
            "{e}"
        );
        src.failing.store(false, Ordering::SeqCst);
        keeper.renew_now().await.unwrap();
        assert!(keeper.bearer().unwrap().starts_with("token-"));
        assert_eq!(keeper.last_error(), None);
    }

    /// At most one fetch per [`MIN_GAP`] in `window`, and the first after one gap.
    fn at_most_one_per_gap(fetches: u32, window: Duration) {
        let most = 1 + (window.as_millis() / MIN_GAP.as_millis()) as u32;
        assert!(
            (1..=most).contains(&fetches),
            "{fetches} token requests in {window:?}"
        );
    }

    #[test]
    fn tokens_that_expire_at_once_are_not_asked_for_in_a_loop() {
        // A source whose every token has expired when it comes (what
        // token_from now refuses; a source that took one anyway) was asked as
        // fast as it answered, its tokens due for renewal at once.
        let src = scripted(Duration::ZERO);
        let keeper =
            TokenKeeper::start(src.clone(), AccessToken::new("t".into(), SystemTime::now()));
        let window = Duration::from_millis(5500);
        std::thread::sleep(window);
        at_most_one_per_gap(src.fetches.load(Ordering::SeqCst), window);
        drop(keeper);
    }

    #[tokio::test]
    async fn forced_renewals_keep_the_minimum_gap() {
        // A service refusing every token forces a renewal for each request.
        let src = scripted(Duration::from_secs(3600));
        let first = AccessToken::new("t".into(), SystemTime::now() + Duration::from_secs(3600));
        let keeper = TokenKeeper::start(src.clone(), first);
        let started = Instant::now();
        let window = Duration::from_millis(5500);
        while started.elapsed() < window {
            let _ = tokio::time::timeout(Duration::from_millis(50), keeper.renew_now()).await;
        }
        at_most_one_per_gap(src.fetches.load(Ordering::SeqCst), started.elapsed());
    }
}
