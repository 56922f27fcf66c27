//! Maintenance loops: heartbeats (lease renewal and cancel requests), the rescuer, and the
//! leader's work (periodic jobs and retention).
//!
//! The rescuer runs in every process but only for kinds that process knows, so a job is never
//! rescued under a policy its rescuer has not seen; its writes are guarded by the lost lease, so
//! two rescuers never both act on one job. Periodic enqueues and pruning run on the leader only.

mod heartbeat;
mod leader;
mod notices;
mod periodic;
mod rescuer;
mod retention;

pub(crate) use heartbeat::heartbeat;
pub(crate) use leader::leader;
pub(crate) use notices::notices;
pub(crate) use rescuer::rescuer;

/// The leadership that retention needs (any process may hold it).
pub(crate) const LEADER: &str = "onus";
/// The leadership that enqueues periodic jobs, contended only by processes that define some:
/// every process that defines periodic jobs should define the same set.
pub(crate) const PERIODIC_LEADER: &str = "onus.periodic";
