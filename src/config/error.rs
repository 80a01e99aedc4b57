//! The errors of the configuration: one refused value (`InvalidValue`, what every value parser
//! returns) and every problem of a load together (`ConfigErrors`, exit 78).

/// Why a value is refused, in words that quote the value (`` `soon` is not a duration … ``);
/// the caller adds where it came from.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct InvalidValue(pub String);

impl From<String> for InvalidValue {
    fn from(s: String) -> Self {
        InvalidValue(s)
    }
}

impl From<&str> for InvalidValue {
    fn from(s: &str) -> Self {
        InvalidValue(s.to_string())
    }
}

/// Every problem found while building the config, one line each, reported together.
#[derive(Debug)]
pub struct ConfigErrors(pub Vec<String>);

impl std::fmt::Display for ConfigErrors {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(f, "invalid configuration ({} problem(s)):", self.0.len())?;
        for e in &self.0 {
            writeln!(f, "  - {e}")?;
        }
        Ok(())
    }
}

impl std::error::Error for ConfigErrors {}
