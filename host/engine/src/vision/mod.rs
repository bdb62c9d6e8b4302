//! Kimi K3's image input (issue 20). So far the files (`decode`) and the
//! release's preprocessing (`preprocess`), bit for bit against Pillow and
//! numpy; the tower, the splice at `<|media_pad|>` and the front ends are
//! still to come.

pub mod decode;
pub mod preprocess;
