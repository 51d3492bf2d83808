//! What the commands read and write besides the library's files: JSON arrays on the
//! command line, the model directory, all-or-nothing outputs, a progress line.

pub mod json_input;
pub mod model_dir;
pub mod outputs;
pub mod progress;
