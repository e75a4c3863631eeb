//! The commands' error: the library's own errors as they are, or one with
//! the step that failed in front of its cause (what `anyhow`'s context does
//! in `main`, whose report prints the whole chain).

use thiserror::Error;

type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

#[derive(Debug, Error)]
pub enum AppError {
    /// A flag or variable with a value the command cannot use.
    #[error("{0}")]
    Usage(String),
    /// `context` failed because of `source`.
    #[error("{context}")]
    Context {
        context: String,
        #[source]
        source: BoxError,
    },
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    #[error(transparent)]
    Node(#[from] crate::node::NodeError),
    #[error(transparent)]
    Session(#[from] crate::nri::session::SessionError),
    #[error(transparent)]
    Monitor(#[from] crate::pressure::MonitorError),
    #[error(transparent)]
    Guard(#[from] crate::guard::GuardError),
    #[error(transparent)]
    Metrics(#[from] crate::metrics::MetricsError),
    #[error(transparent)]
    Audit(#[from] crate::audit::AuditError),
    #[error(transparent)]
    Json(#[from] serde_json::Error),
}

/// `.context(..)` for the commands: wraps an error as [`AppError::Context`].
pub trait Context<T> {
    fn context(self, context: impl Into<String>) -> Result<T, AppError>;
    fn with_context<S: Into<String>>(self, f: impl FnOnce() -> S) -> Result<T, AppError>;
}

impl<T, E: Into<BoxError>> Context<T> for Result<T, E> {
    fn context(self, context: impl Into<String>) -> Result<T, AppError> {
        self.map_err(|e| AppError::Context {
            context: context.into(),
            source: e.into(),
        })
    }

    fn with_context<S: Into<String>>(self, f: impl FnOnce() -> S) -> Result<T, AppError> {
        self.map_err(|e| AppError::Context {
            context: f().into(),
            source: e.into(),
        })
    }
}
