//! Hyperparameter names.

/// Builds the names `prefix`, or `prefix[i]` for vector-valued parameters.
pub(crate) fn indexed_names(prefix: &str, len: usize) -> Vec<String> {
    if len == 1 {
        vec![prefix.to_string()]
    } else {
        (0..len).map(|i| format!("{prefix}[{i}]")).collect()
    }
}
