//! The admin queue's entry point: a command goes to the controller's
//! properties (Property Get/Set) or, by the command table's row for its
//! opcode, to its body in `controller.rs`. (The table names those bodies,
//! so the dispatch that reads the table lives above both.)

use crate::command_table::{self, Command, Handler, QueueKind};
use crate::controller::{AdminOutcome, Completion, Controller};
use crate::fabrics::fctype;
use crate::queue_entry::Sqe;
use crate::Status;
use std::time::Instant;

impl Controller {
    /// Execute one admin command (everything but Connect/Disconnect).
    pub fn execute_admin(&mut self, sqe: &Sqe, data: &[u8], now: Instant) -> AdminOutcome {
        self.keep_alive.touch(now);
        let cid = sqe.cid();
        let done = |c: Completion| AdminOutcome::Complete(c);
        if sqe.is_fabrics() {
            return done(match sqe.fctype() {
                fctype::PROPERTY_GET | fctype::PROPERTY_SET => self.property(sqe),
                // No authentication is offered (Connect never asks for it).
                _ => Completion::status(cid, Status::INVALID_OPCODE.dnr()),
            });
        }
        if !self.ready() {
            return done(Completion::status(cid, Status::CMD_SEQ_ERROR));
        }
        match command_table::lookup(QueueKind::Admin, sqe.opcode()) {
            Some(Command { handler: Handler::Admin(run), discovery, .. }) if *discovery || !self.is_discovery() => run(self, sqe, data),
            _ => done(Completion::status(cid, Status::INVALID_OPCODE.dnr())),
        }
    }
}
