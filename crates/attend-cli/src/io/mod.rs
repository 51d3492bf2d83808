//! What the commands read and write besides the library's files: JSON arrays on the
//! command line, the model directory, all-or-nothing outputs and the temporary
//! files they clean up, standard output and error without panics, a progress line.

pub mod cleanup;
pub mod console;
pub mod json_input;
pub mod model_dir;
pub mod outputs;
pub mod progress;
