//! Why a control request changed nothing.

/// A change refused: nothing was changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused(pub String);

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl From<String> for Refused {
    fn from(s: String) -> Refused {
        Refused(s)
    }
}

impl From<&str> for Refused {
    fn from(s: &str) -> Refused {
        Refused(s.into())
    }
}
