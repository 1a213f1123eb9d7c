//! ugds
