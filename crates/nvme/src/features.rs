//! The features the NVMe base specification makes mandatory for every I/O
//! controller and that carry no behaviour here (Arbitration, Power
//! Management, Temperature Threshold, Write Atomicity Normal): their values
//! are kept so Get Features returns what Set Features stored, and out-of-
//! range values are refused. (Number of Queues, Async Event Configuration,
//! Keep Alive and Volatile Write Cache live in the controller, where they act.)

use crate::status::Status;

pub const ARBITRATION: u8 = 0x01;
pub const POWER_MGMT: u8 = 0x02;
pub const TEMP_THRESHOLD: u8 = 0x04;
pub const WRITE_ATOMICITY: u8 = 0x0A;

/// Default over-temperature threshold of the composite sensor, kelvin
/// (the SMART log reports 303 K; WCTEMP is 0, so the default is ours).
const DEFAULT_OVER_TEMP: u16 = 343;
/// Arbitration: round robin only (AMS 0), burst "no limit" (AB 111b).
const DEFAULT_ARBITRATION: u32 = 0x7;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlainFeatures {
    arbitration: u32,
    over_temp: u16,
    under_temp: u16,
    write_atomicity: u32,
}

impl Default for PlainFeatures {
    fn default() -> Self {
        PlainFeatures { arbitration: DEFAULT_ARBITRATION, over_temp: DEFAULT_OVER_TEMP, under_temp: 0, write_atomicity: 0 }
    }
}

/// Temperature Threshold dword 11: (threshold, sensor select, threshold type).
fn temp_fields(cdw11: u32) -> (u16, u32, u32) {
    (cdw11 as u16, (cdw11 >> 16) & 0xF, (cdw11 >> 20) & 0x3)
}

impl PlainFeatures {
    pub fn handles(fid: u8) -> bool {
        matches!(fid, ARBITRATION | POWER_MGMT | TEMP_THRESHOLD | WRITE_ATOMICITY)
    }

    /// Set Features for one of [`PlainFeatures::handles`]' ids.
    pub fn set(&mut self, fid: u8, cdw11: u32) -> Result<(), Status> {
        match fid {
            ARBITRATION => self.arbitration = cdw11,
            // One power state (NPSS 0): only PS 0, no workload hint.
            POWER_MGMT if cdw11 & 0xFF == 0 => {}
            TEMP_THRESHOLD => {
                // Only the composite sensor (0), or all sensors (0xF), exists.
                let (t, sensor, kind) = temp_fields(cdw11);
                match (sensor, kind) {
                    (0 | 0xF, 0) => self.over_temp = t,
                    (0 | 0xF, 1) => self.under_temp = t,
                    _ => return Err(Status::INVALID_FIELD),
                }
            }
            WRITE_ATOMICITY => self.write_atomicity = cdw11 & 1,
            _ => return Err(Status::INVALID_FIELD),
        }
        Ok(())
    }

    /// Get Features: the current value, or the default with `default`.
    pub fn get(&self, fid: u8, cdw11: u32, default: bool) -> Result<u32, Status> {
        let cur = if default { &PlainFeatures::default() } else { self };
        Ok(match fid {
            ARBITRATION => cur.arbitration,
            POWER_MGMT => 0,
            TEMP_THRESHOLD => {
                let (_, sensor, kind) = temp_fields(cdw11);
                let t = match (sensor, kind) {
                    (0, 0) => cur.over_temp,
                    (0, 1) => cur.under_temp,
                    _ => return Err(Status::INVALID_FIELD),
                };
                t as u32 | (cdw11 & 0x003F_0000)
            }
            WRITE_ATOMICITY => cur.write_atomicity,
            _ => return Err(Status::INVALID_FIELD),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_round_trip_and_bad_ones_are_refused() {
        let mut f = PlainFeatures::default();
        assert_eq!(f.get(ARBITRATION, 0, false), Ok(7));
        assert_eq!(f.get(TEMP_THRESHOLD, 0, false), Ok(343));
        f.set(TEMP_THRESHOLD, 0x0000_0157).unwrap();
        f.set(TEMP_THRESHOLD, 0x0010_0100).unwrap(); // under threshold 256 K
        assert_eq!(f.get(TEMP_THRESHOLD, 0, false), Ok(0x157));
        assert_eq!(f.get(TEMP_THRESHOLD, 0x0010_0000, false), Ok(0x0010_0100));
        assert_eq!(f.get(TEMP_THRESHOLD, 0, true), Ok(343));
        assert_eq!(f.set(TEMP_THRESHOLD, 0x0001_0100), Err(Status::INVALID_FIELD)); // sensor 1
        assert_eq!(f.set(TEMP_THRESHOLD, 0x0020_0100), Err(Status::INVALID_FIELD)); // THSEL 2
        assert_eq!(f.set(POWER_MGMT, 1), Err(Status::INVALID_FIELD));
        f.set(POWER_MGMT, 0).unwrap();
        f.set(WRITE_ATOMICITY, 1).unwrap();
        assert_eq!(f.get(WRITE_ATOMICITY, 0, false), Ok(1));
        assert_eq!(f.get(WRITE_ATOMICITY, 0, true), Ok(0));
        assert!(!PlainFeatures::handles(0x7e));
    }
}
