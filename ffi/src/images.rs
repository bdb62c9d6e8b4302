//! Images (Kimi K3 with its vision tower): an image file through the
//! model's tower, attached to the session for the next prompt that holds
//! its markup (tokenized as markup, or in a chat message's `media`).

use std::ffi::c_char;

use crate::session::{check_out, waste_session, with_session};
use crate::waste_result;
use crate::{copy_out, host, null, slice_arg};

/// Bytes that always hold an image's markup (a size of up to 20 digits a
/// side and K3's four media tokens).
pub const WASTE_IMAGE_MARKUP_MAX: usize = 128;

/// An image attached with [`waste_session_attach_image`].
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct waste_image_info {
    /// The size the file declares.
    pub width: usize,
    pub height: usize,
    /// Prompt positions the image's rows take.
    pub tokens: usize,
}

/// Runs an image file's bytes (PNG, JPEG, WebP, a GIF's first frame)
/// through the model's vision tower and attaches it to the session: the
/// next image placeholder of an evaluated prompt takes it (in attachment
/// order). `*info` receives its size and positions; `markup` (`cap` bytes,
/// [`WASTE_IMAGE_MARKUP_MAX`] always suffice) the prompt text that stands
/// for it, UTF-8, not NUL-terminated, `*markup_len` bytes. A model without
/// a tower gives `WASTE_UNSUPPORTED`; a malformed or oversized image
/// `WASTE_ARG`; a short buffer `WASTE_BUFFER_TOO_SMALL` and nothing is
/// attached.
#[no_mangle]
pub unsafe extern "C" fn waste_session_attach_image(
    session: *mut waste_session,
    bytes: *const u8,
    len: usize,
    info: *mut waste_image_info,
    markup: *mut c_char,
    cap: usize,
    markup_len: *mut usize,
) -> waste_result {
    // SAFETY: forwarded caller pointers, each checked before use.
    unsafe {
        with_session(session, |s| {
            check_out(markup_len)?;
            if info.is_null() {
                return Err(null("info"));
            }
            let image = s.encode_image(slice_arg("bytes", bytes, len)?).map_err(host)?;
            copy_out(image.markup().as_bytes(), markup as *mut u8, cap, markup_len)?;
            s.attach(&image);
            *info = waste_image_info { width: image.width(), height: image.height(), tokens: image.tokens() };
            Ok(())
        })
    }
}

/// Drops the images attached and not yet taken by a placeholder.
#[no_mangle]
pub unsafe extern "C" fn waste_session_detach_images(session: *mut waste_session) -> waste_result {
    // SAFETY: forwarded caller pointer.
    unsafe {
        with_session(session, |s| {
            s.detach_images();
            Ok(())
        })
    }
}
