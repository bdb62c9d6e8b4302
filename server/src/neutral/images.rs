//! Images in requests (issue 20): inline only, as base64 (OpenAI's
//! `image_url` parts with a `data:` URL, Anthropic's `image` blocks with a
//! base64 source, Ollama's `images` lists). A URL is never fetched. Each image becomes its markup in
//! the message's `media` (the size comes from the file's header) and its
//! bytes go with the prompt; the engine thread runs them through the
//! model's vision tower.

use base64::Engine as _;

use super::fields::bad;
use crate::error::ApiError;

/// Images one request may carry (the earlier engine's limit).
pub const MAX_IMAGES: usize = 32;

/// Decoded image files of a prompt, in order, beside the markup already in
/// its messages.
#[derive(Clone, Default)]
pub struct Images {
    pub files: Vec<Vec<u8>>,
}

impl Images {
    /// Adds an image given as base64 and returns the markup that stands for
    /// it; `param` names the field in errors.
    pub fn add_base64(&mut self, data: &str, param: &str) -> Result<String, ApiError> {
        if self.files.len() >= MAX_IMAGES {
            return Err(ApiError::bad_request(
                format!("`{param}`: more than {MAX_IMAGES} images in one request"),
                Some(param),
            ));
        }
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(data.trim())
            .map_err(|e| bad(param, &format!("base64 image data ({e})")))?;
        let (w, h) = waste_host::image_dimensions(&bytes)
            .map_err(|e| ApiError::bad_request(format!("`{param}`: {e}"), Some(param)))?;
        self.files.push(bytes);
        Ok(waste_host::image_markup(w, h))
    }

    /// An OpenAI `image_url.url`: `data:image/...;base64,...` only.
    pub fn add_url(&mut self, url: &str, param: &str) -> Result<String, ApiError> {
        if url.starts_with("http://") || url.starts_with("https://") || url.starts_with("file:") {
            return Err(ApiError::bad_request(
                format!("`{param}`: image URLs are not fetched; send the image inline as a data: URL (base64)"),
                Some(param),
            ));
        }
        let data = url
            .strip_prefix("data:")
            .and_then(|rest| rest.split_once(','))
            .filter(|(kind, _)| kind.ends_with(";base64"))
            .map(|(_, data)| data)
            .ok_or_else(|| bad(param, "a data: URL with base64 image data (data:image/png;base64,...)"))?;
        self.add_base64(data, param)
    }
}
