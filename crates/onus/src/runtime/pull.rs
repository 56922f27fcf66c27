//! Workers outside the process (any language, over HTTP): they claim due jobs of a queue under a
//! lease and answer each once with the lease token they were given. The job layer decides what
//! an answer means exactly as for a handler in the process: a failure is classified, and the
//! kind's policy alone says when to try again. An answer whose lease is no longer current
//! (rescued, claimed again, already answered) changes nothing.

use std::time::Duration;

use rand::distributions::{Alphanumeric, DistString};

use crate::clock::{add, Timestamp};
use crate::job::{Job, JobId, JobState};
use crate::outcome::{AttemptEnd, Transition};
use crate::store::{ClaimRequest, HeldJob, StoreError};
use crate::JobResult;

use super::admission::Admission;
use super::{Client, Error};

/// The longest a claim waits for a job to come due.
pub const MAX_CLAIM_WAIT: Duration = Duration::from_secs(30);
/// The most jobs one claim takes.
pub const MAX_CLAIM: usize = 1000;

/// The prefix of the lease owner of jobs claimed by an outside worker.
pub(crate) const OWNER_PREFIX: &str = "pull:";

/// A job claimed by an outside worker, with the token its answer must carry.
#[derive(Debug, Clone, PartialEq)]
pub struct Claimed {
    /// The job, running, its attempt counted.
    pub job: Job,
    /// Proves an answer is for this lease.
    pub lease_token: String,
    /// When the lease lapses unless renewed by a heartbeat: then the job is rescued as "worker
    /// lost" under its policy.
    pub lease_expires_at: Timestamp,
}

/// What a pull worker's heartbeat (a beat: its lease renewed, while it still holds the job)
/// found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Beat {
    /// The lease's new end.
    pub lease_expires_at: Timestamp,
    /// Someone asked to cancel the job: stop and answer (a failure ends it cancelled).
    pub cancel_requested: bool,
}

/// A lease token taken apart: the owner and the attempt it was issued for.
struct Lease {
    owner: String,
    attempt: u32,
}

impl Lease {
    /// Whether this lease is the running job's current one.
    fn holds(&self, job: &Job) -> bool {
        job.state == JobState::Running
            && job.lease_owner.as_deref() == Some(self.owner.as_str())
            && job.attempt == self.attempt
    }
}

/// The length of a lease token's secret part.
const SECRET_LEN: usize = 32;
/// The length of the owner part of a token of the previous form (`<owner>.<attempt>`).
const LEGACY_LEN: usize = 24;

/// A new lease: the token the worker is given (`<secret>.<attempt>` once the attempt is known)
/// and the owner written on the job, `pull:` and the first 32 hex digits of the secret's
/// SHA-256. Whoever can read the job (its JSON, the panel) sees the owner, never the secret, and
/// cannot answer for the lease.
fn new_lease() -> (String, String) {
    let secret = Alphanumeric.sample_string(&mut rand::thread_rng(), SECRET_LEN);
    let owner = owner_of(&secret);
    (secret, owner)
}

fn owner_of(secret: &str) -> String {
    use sha2::Digest;
    let digest = sha2::Sha256::digest(secret.as_bytes());
    let hex: String = digest[..16].iter().map(|b| format!("{b:02x}")).collect();
    format!("{OWNER_PREFIX}{hex}")
}

fn token_of(secret: &str, attempt: u32) -> String {
    format!("{secret}.{attempt}")
}

fn stale(id: JobId) -> Error {
    Error::Store(StoreError::Conflict(format!(
        "the lease on job {id} is no longer current (its lease expired and it was rescued, claimed again, or already answered); drop the job"
    )))
}

/// How long a heartbeat waits for its job's row while another transaction writes it.
const ROW_WAIT: Duration = Duration::from_secs(2);

/// The refusal of a heartbeat for a job asked to cancel whose grace has run out.
fn cancelled(id: JobId, grace: Duration) -> Error {
    Error::Store(StoreError::Conflict(format!(
        "cancel_requested: job {id} was asked to cancel and its grace ({}) has run out; stop the work: the job ends cancelled",
        crate::policy::human(grace)
    )))
}

fn parse_token(token: &str) -> Result<Lease, Error> {
    let bad = || {
        Error::Invalid(
            "lease_token: not a lease token; pass the lease_token the claim answered".into(),
        )
    };
    let (secret, attempt) = token.rsplit_once('.').ok_or_else(bad)?;
    if !secret.chars().all(|c| c.is_ascii_alphanumeric()) {
        return Err(bad());
    }
    if secret.len() == LEGACY_LEN && attempt.parse::<u32>().is_ok() {
        // Handed out before this version: its lease is not one this version can prove.
        return Err(Error::Store(StoreError::Conflict(
            "the lease_token was handed out before the server was upgraded and is no longer current; drop the job (it is rescued when its lease lapses)".into(),
        )));
    }
    if secret.len() != SECRET_LEN {
        return Err(bad());
    }
    let attempt = attempt.parse().map_err(|_| bad())?;
    Ok(Lease {
        owner: owner_of(secret),
        attempt,
    })
}

impl Client {
    fn pull_kind(&self, kind: &str) -> Result<&super::Kind, Error> {
        self.shared.kinds.get(kind).ok_or_else(|| {
            let mut known: Vec<&str> = self.shared.kinds.keys().map(String::as_str).collect();
            known.sort_unstable();
            Error::Invalid(format!(
                "kinds: unknown kind {kind:?}; known kinds: {}",
                known.join(", ")
            ))
        })
    }

    /// Claims up to `limit` due jobs of `kinds` in `queue` for an outside worker, waiting up to
    /// `wait` for one to come due when none is. Each is leased for its kind's timeout (renew with
    /// [`Client::heartbeat_lease`]).
    pub async fn claim_for_worker(
        &self,
        queue: &str,
        kinds: &[String],
        limit: usize,
        wait: Duration,
    ) -> Result<Vec<Claimed>, Error> {
        super::prepare::check_name("queue", queue)?;
        if kinds.is_empty() {
            return Err(Error::Invalid(
                "kinds: name at least one kind to claim".into(),
            ));
        }
        if limit == 0 || limit > MAX_CLAIM {
            return Err(Error::Invalid(format!(
                "limit: {limit} is not a claim size; claim 1 to {MAX_CLAIM} jobs"
            )));
        }
        if wait > MAX_CLAIM_WAIT {
            return Err(Error::Invalid(format!(
                "wait: a claim waits at most {} s",
                MAX_CLAIM_WAIT.as_secs()
            )));
        }
        // A lease written with a clock far off the database's would be misread by every other
        // process (one running behind writes leases that look expired at once).
        if !super::skew::Skew::within_bound_now(&self.shared).await {
            return Err(off_clock(&self.shared));
        }
        // Kinds sharing a timeout are claimed in one statement (priority and due time decide
        // among them); each group is leased for its timeout.
        let mut groups: std::collections::BTreeMap<Duration, Vec<String>> = Default::default();
        for k in kinds {
            let timeout = self.pull_kind(k)?.policy.timeout;
            let g = groups.entry(timeout).or_default();
            if !g.contains(k) {
                g.push(k.clone());
            }
        }
        let (secret, owner) = new_lease();
        let deadline = tokio::time::Instant::now() + wait;
        let woken = self.shared.hub.queue(queue);
        loop {
            // Registered before the claim, so an insert right after it is not missed.
            let notified = woken.notified();
            let mut out = Vec::new();
            for (timeout, group) in &groups {
                if out.len() >= limit {
                    break;
                }
                let now = self.now();
                let until = add(now, *timeout);
                let jobs = self
                    .shared
                    .store
                    .claim(ClaimRequest {
                        queue: queue.to_string(),
                        kinds: group.clone(),
                        limit: limit - out.len(),
                        owner: owner.clone(),
                        now,
                        lease_until: until,
                        caps: self.shared.caps(group),
                        lease_slots: self.shared.lease_slots(group),
                    })
                    .await?;
                super::metrics::picked_up(queue, jobs.iter().map(|j| now - j.run_at));
                let jobs = self.admit_claimed(jobs).await;
                out.extend(jobs.into_iter().map(|job| Claimed {
                    lease_token: token_of(&secret, job.attempt),
                    lease_expires_at: job.lease_expires_at.unwrap_or(until),
                    job,
                }));
            }
            if out.len() >= limit {
                // A wake-up reaches one waiter: one that found as many jobs as it could take
                // passes it on, so the other waiting claims look for the rest of a burst.
                self.shared.hub.wake(queue);
            }
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            if !out.is_empty() || left.is_zero() {
                return Ok(out);
            }
            // Woken by an insert or a resume in this process or (PostgreSQL) another; jobs that
            // come due by time are found by looking again within a second.
            let _ = tokio::time::timeout(left.min(Duration::from_secs(1)), notified).await;
        }
    }

    /// Admits the claimed jobs as a worker in the process admits its own ([`super::admission`]):
    /// only the admitted are handed out; the others are deferred, snoozed or handed back.
    async fn admit_claimed(&self, jobs: Vec<Job>) -> Vec<Job> {
        let mut out = Vec::with_capacity(jobs.len());
        for job in jobs {
            match super::admission::admit(&self.shared, &job).await {
                Admission::Run => out.push(job),
                Admission::Write(t) => self.hand_back(&job, t).await,
            }
        }
        out
    }

    /// Writes `t` for a claimed job not handed out (letting go of its lease key's slot).
    async fn hand_back(&self, job: &Job, t: Transition) {
        let back = super::attempt::finish_of(&self.shared, job, t);
        if let Err(e) = self.shared.store.finish(&[back]).await {
            tracing::warn!(job = job.id, error = %e, "cannot write the claimed job's state; its lease will run out");
        }
    }

    /// Renews the lease on a job an outside worker runs, for its kind's timeout from now, and
    /// records its progress if it reports one (`fraction` from 0 to 1 and a message).
    pub async fn heartbeat_lease(
        &self,
        id: JobId,
        token: &str,
        progress: Option<(f64, &str)>,
    ) -> Result<Beat, Error> {
        let ask = BeatAsk {
            id,
            lease_token: token.to_string(),
            progress: progress.map(|(f, m)| (f, m.to_string())),
        };
        self.heartbeat_all(vec![ask]).await?.remove(0)
    }

    /// Renews the leases of many jobs outside workers run (up to [`MAX_CLAIM`]), each for its
    /// kind's timeout from now, with one read of the jobs and one renewal per lease; each is
    /// renewed or refused on its own, as [`Client::heartbeat_lease`] would. The outer error is
    /// for the call as a whole.
    pub async fn heartbeat_all(
        &self,
        asks: Vec<BeatAsk>,
    ) -> Result<Vec<Result<Beat, Error>>, Error> {
        at_most("heartbeats", asks.len())?;
        let now = self.now();
        let mut out: Vec<Result<Beat, Error>> = Vec::with_capacity(asks.len());
        let mut checked = Vec::with_capacity(asks.len());
        let mut seen = std::collections::HashSet::new();
        for a in &asks {
            let progress = a
                .progress
                .as_ref()
                .map(|(f, m)| crate::job::Progress::new(*f, m, now))
                .transpose()
                .map_err(|e| Error::Invalid(e.0));
            let lease = parse_token(&a.lease_token);
            let twice = !seen.insert(a.id);
            checked.push(match (lease, progress) {
                _ if twice => Err(Error::Invalid(format!(
                    "id: job {} has two heartbeats in this call; send one for each job",
                    a.id
                ))),
                (Err(e), _) | (_, Err(e)) => Err(e),
                (Ok(l), Ok(p)) => Ok((l, p)),
            });
        }
        if !super::skew::Skew::within_bound_now(&self.shared).await {
            return Err(off_clock(&self.shared));
        }
        let ids: Vec<JobId> = asks
            .iter()
            .zip(&checked)
            .filter(|(_, c)| c.is_ok())
            .map(|(a, _)| a.id)
            .collect();
        let jobs = self.jobs_by_id(&ids).await?;
        // The renewals to write, one per lease owner and new lease end.
        type Renewing = std::collections::BTreeMap<(String, Timestamp), Vec<HeldJob>>;
        let mut renewing = Renewing::new();
        let mut until_of = Vec::with_capacity(asks.len());
        for (a, c) in asks.iter().zip(checked.iter()) {
            let until = match c {
                Err(_) => None,
                Ok((lease, _)) => match self.renewal_of(a.id, lease, jobs.get(&a.id), now) {
                    Ok(until) => {
                        renewing
                            .entry((lease.owner.clone(), until))
                            .or_default()
                            .push(HeldJob {
                                id: a.id,
                                attempt: lease.attempt,
                            });
                        Some(Ok(until))
                    }
                    Err(e) => Some(Err(e)),
                },
            };
            until_of.push(until);
        }
        // A renewal skips a row another transaction is writing (a completion batch, a cancel)
        // rather than wait for it, which is right for a process renewing thousands of leases
        // but not for a worker's few jobs: wait for the rows a little, then say to try again.
        let mut renewed = std::collections::HashSet::new();
        let mut cancel = std::collections::HashSet::new();
        let mut lost = std::collections::HashSet::new();
        for ((owner, until), mut held) in renewing {
            let waiting = tokio::time::Instant::now() + ROW_WAIT;
            loop {
                let r = self.shared.store.heartbeat(&owner, &held, until).await?;
                renewed.extend(r.renewed.iter().copied());
                cancel.extend(r.cancel.iter().copied());
                lost.extend(r.lost.iter().copied());
                held.retain(|h| !renewed.contains(&h.id) && !lost.contains(&h.id));
                if held.is_empty() || tokio::time::Instant::now() >= waiting {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        for ((a, c), until) in asks.iter().zip(checked).zip(until_of) {
            let id = a.id;
            out.push(match (c, until) {
                (Err(e), _) => Err(e),
                (_, Some(Err(e))) => Err(e),
                (Ok((lease, progress)), Some(Ok(until))) => {
                    if renewed.contains(&id) {
                        match &progress {
                            Some(p) => match self
                                .shared
                                .store
                                .report_progress(id, &lease.owner, lease.attempt, p)
                                .await
                            {
                                Ok(true) => Ok(until),
                                Ok(false) => Err(stale(id)),
                                Err(e) => Err(e.into()),
                            },
                            None => Ok(until),
                        }
                        .map(|until| Beat {
                            lease_expires_at: until,
                            cancel_requested: cancel.contains(&id),
                        })
                    } else if lost.contains(&id) {
                        Err(stale(id))
                    } else {
                        Err(Error::Store(StoreError::Unavailable(format!(
                            "job {id}'s row is being written by another transaction; its lease is still yours: send the heartbeat again"
                        ), None)))
                    }
                }
                (Ok(_), None) => Err(stale(id)),
            });
        }
        Ok(out)
    }

    /// The write that records answer `a` for `job` (`None`: not found), claimed under `lease`,
    /// with the state it leaves the job in; or why the answer is refused.
    fn finish_for<'j>(
        &self,
        a: Answer,
        lease: &Lease,
        job: Option<&'j Job>,
    ) -> Result<(crate::store::Finish, JobState, &'j Job), Error> {
        let job = job.ok_or(Error::Store(StoreError::NotFound(a.id)))?;
        if !lease.holds(job) {
            return Err(stale(a.id));
        }
        if let Err(crate::JobError::Snooze {
            pause_key: true, ..
        }) = &a.result
        {
            if job.lease_key.is_none() {
                return Err(Error::Invalid(format!(
                    "pause_key: job {} holds no lease key to pause; snooze it without pause_key, or give its kind a lease_key",
                    a.id
                )));
            }
        }
        let policy = &self.pull_kind(&job.kind)?.policy;
        let end = match a.result {
            Err(_) if job.cancel_requested => AttemptEnd::Cancelled,
            r => AttemptEnd::Returned(r),
        };
        // A job with a lease key took it at its claim; its answer releases it.
        let mut finish = super::attempt::ended(&self.shared, job, Some(end), policy);
        finish.result = a
            .kept
            .filter(|_| matches!(finish.transition, Transition::Complete));
        let state = finish
            .write_for(job.cancel_requested, job.lease_expires_at, false)
            .map_or(JobState::Running, |w| w.state);
        Ok((finish, state, job))
    }

    /// The jobs of `ids` that exist, by id: one read (by its key when there is one id).
    async fn jobs_by_id(
        &self,
        ids: &[JobId],
    ) -> Result<std::collections::HashMap<JobId, Job>, Error> {
        let found = match ids {
            [] => Vec::new(),
            [id] => self.shared.store.get(*id).await?.into_iter().collect(),
            _ => {
                let filter = crate::store::JobFilter {
                    ids: ids.to_vec(),
                    ..Default::default()
                };
                self.shared.store.list(&filter, ids.len(), None).await?
            }
        };
        Ok(found.into_iter().map(|j| (j.id, j)).collect())
    }

    /// The new end of the lease on `job` (`None`: not found) for a heartbeat of `lease`, or why
    /// the heartbeat is refused: the lease is not current, or the job was asked to cancel and its
    /// grace has run out.
    fn renewal_of(
        &self,
        id: JobId,
        lease: &Lease,
        job: Option<&Job>,
        now: Timestamp,
    ) -> Result<Timestamp, Error> {
        let job = job.ok_or(Error::Store(StoreError::NotFound(id)))?;
        if !lease.holds(job) {
            return Err(stale(id));
        }
        let timeout = self.pull_kind(&job.kind)?.policy.timeout;
        let mut until = add(now, timeout);
        if job.cancel_requested {
            // A job asked to cancel gets `cancel_grace` to stop: its lease is never extended
            // past that, and once it lapses the heartbeat is refused and the rescuer ends the
            // job cancelled (releasing its key's slot and its kind's room).
            let lapsed = job.lease_expires_at.unwrap_or(now);
            if lapsed <= now {
                return Err(cancelled(id, self.shared.options.cancel_grace));
            }
            until = until
                .min(lapsed)
                .min(add(now, self.shared.options.cancel_grace));
        }
        Ok(until)
    }

    /// Records an outside worker's answer for the attempt its token names: `Ok(())` completes
    /// the job; an error is classified and the kind's policy decides, exactly as for a handler
    /// in the process. Returns the job as it now stands.
    pub async fn answer(&self, id: JobId, token: &str, result: JobResult) -> Result<Job, Error> {
        self.answer_keeping(id, token, result, None).await
    }

    /// [`Client::answer`], keeping `kept` as the job's result when the answer completes it
    /// (checked by [`crate::job::check_result`]; ignored for any other answer).
    pub async fn answer_keeping(
        &self,
        id: JobId,
        token: &str,
        result: JobResult,
        kept: Option<serde_json::Value>,
    ) -> Result<Job, Error> {
        let answer = Answer {
            id,
            lease_token: token.to_string(),
            result,
            kept,
        };
        let mut answered = self.answer_all(vec![answer]).await?;
        answered.remove(0)?;
        self.get(id).await
    }

    /// Answers many claimed jobs at once (up to [`MAX_CLAIM`]): one read of the jobs and one
    /// write of every outcome, which concurrent callers' writes share on PostgreSQL. Each answer
    /// is applied or refused on its own, exactly as [`Client::answer_keeping`] would: the result
    /// says, in order, the state each job is left in or why its answer was refused. The outer
    /// error is for the call as a whole (too many answers, the database out of reach).
    pub async fn answer_all(
        &self,
        answers: Vec<Answer>,
    ) -> Result<Vec<Result<JobState, Error>>, Error> {
        at_most("answers", answers.len())?;
        let mut seen = std::collections::HashSet::new();
        let checked: Vec<Result<Lease, Error>> = answers
            .iter()
            .map(|a| {
                let lease = parse_token(&a.lease_token)?;
                if !seen.insert(a.id) {
                    return Err(Error::Invalid(format!(
                        "id: job {} is answered twice in this call; answer each job once",
                        a.id
                    )));
                }
                if let Some(v) = &a.kept {
                    crate::job::check_result(v).map_err(|e| Error::Invalid(e.0))?;
                }
                Ok(lease)
            })
            .collect();
        let ids: Vec<JobId> = answers
            .iter()
            .zip(&checked)
            .filter(|(_, c)| c.is_ok())
            .map(|(a, _)| a.id)
            .collect();
        let jobs = self.jobs_by_id(&ids).await?;
        let now = self.now();
        let mut finishes = Vec::with_capacity(ids.len());
        // For each finish: the answer it is for, the state it leaves the job in, the job.
        let mut written: Vec<(usize, JobState, &Job)> = Vec::with_capacity(ids.len());
        let mut out: Vec<Result<JobState, Error>> = Vec::with_capacity(answers.len());
        for (i, (a, lease)) in answers.into_iter().zip(checked).enumerate() {
            let job = jobs.get(&a.id);
            match lease.and_then(|lease| self.finish_for(a, &lease, job)) {
                Ok((finish, state, job)) => {
                    written.push((i, state, job));
                    finishes.push(finish);
                    out.push(Ok(state));
                }
                Err(e) => out.push(Err(e)),
            }
        }
        if finishes.is_empty() {
            return Ok(out);
        }
        let applied = self.shared.store.finish(&finishes).await?;
        let transitions: Vec<&Transition> = finishes.iter().map(|f| &f.transition).collect();
        // A failure or snooze meets a cancel asked for since the read, which the write turns
        // into the job's end: the state said is the one written, read back.
        let later: Vec<JobId> = written
            .iter()
            .zip(&applied)
            .zip(&transitions)
            .filter(|((_, ok), t)| **ok && !matches!(t, Transition::Complete))
            .map(|(((_, _, job), _), _)| job.id)
            .collect();
        // Written already: a read that fails leaves the state the write was asked for.
        let read_back = self.jobs_by_id(&later).await.unwrap_or_default();
        let mut queues = std::collections::BTreeSet::new();
        for (((i, state, job), ok), t) in written.into_iter().zip(applied).zip(&transitions) {
            if !ok {
                out[i] = Err(stale(job.id));
                continue;
            }
            let took = job.attempted_at.and_then(|at| (now - at).to_std().ok());
            match self.shared.kinds.get(&job.kind) {
                Some(kind) => kind.meters.attempt(t, took),
                None => super::metrics::KindMeters::new(&job.kind).attempt(t, took),
            }
            queues.insert(job.queue.as_str());
            out[i] = Ok(read_back.get(&job.id).map_or(state, |j| j.state));
        }
        for q in queues {
            self.shared.hub.wake(q);
        }
        Ok(out)
    }
}

/// One heartbeat of [`Client::heartbeat_all`]: the job, the lease token its claim answered,
/// and the worker's progress if it reports one (a fraction from 0 to 1 and what it is doing).
#[derive(Debug)]
pub struct BeatAsk {
    /// The job.
    pub id: JobId,
    /// The `lease_token` its claim answered.
    pub lease_token: String,
    /// How much is done, and what it is doing.
    pub progress: Option<(f64, String)>,
}

/// One answer of [`Client::answer_all`]: the job, the lease token its claim answered, how the
/// attempt ended, and for a completion the small JSON result to keep with the job.
#[derive(Debug)]
pub struct Answer {
    /// The job.
    pub id: JobId,
    /// The `lease_token` its claim answered.
    pub lease_token: String,
    /// How the attempt ended: the job layer's policy decides what a failure means.
    pub result: JobResult,
    /// Kept with the job when the answer completes it (at most 64 KiB of JSON).
    pub kept: Option<serde_json::Value>,
}

/// Refuses a call of more than [`MAX_CLAIM`] items (`what`: the list, as the API names it).
pub fn at_most(what: &str, n: usize) -> Result<(), Error> {
    if n > MAX_CLAIM {
        return Err(Error::Invalid(format!(
            "{what}: {n} {what} in one call; send at most {MAX_CLAIM}"
        )));
    }
    Ok(())
}

/// The refusal of a process whose clock is off the database's by more than the bound.
fn off_clock(shared: &super::Shared) -> Error {
    Error::Store(StoreError::Unavailable(format!(
        "this server's clock is off the database's by more than {}, so the leases it writes would be misread; it hands out and renews no leases until its clock is in sync (NTP): use another server meanwhile",
        crate::policy::human(super::skew::Skew::rescue_bound(shared))
    ), None))
}
