//! `blockwire lab --resume DIR`: a run goes on where it stopped. Every run
//! keeps a record of what it measured as it measures it (`record`), and the
//! plan it runs (`stored_plan`); what a case is, by name (`case`); the
//! bookkeeping that skips finished cases and puts the results of all starts
//! together (`book`); a storage run's start as part of it (`run`).

pub mod book;
pub mod case;
pub mod record;
pub mod run;
pub mod stored_plan;
