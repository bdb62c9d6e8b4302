//! Image files to the pixels Kimi K3's processor starts from
//! (K3-VISION.md §2.1 step 1): PNG, JPEG, WebP and a GIF's first frame,
//! decoded with the `image` crate; an image with an alpha band or a
//! transparency entry as RGBA, anything else as RGB; EXIF orientation not
//! applied (PIL's `open`, which the release uses, does not). The size is
//! read from the header and bounded before any pixel is decoded.
//!
//! Where this differs from Pillow: JPEG is decoded by zune-jpeg, not
//! libjpeg-turbo (a few levels apart on some pixels; measured by
//! tests/integration/k3_vision.rs); a GIF whose transparency entry no pixel
//! uses decodes as RGB here and RGBA in PIL (the `image` crate does not
//! report the entry); 16-bit PNGs are scaled to 8 bits where PIL keeps the
//! high byte.

use std::io::Cursor;

use image::{ImageFormat, ImageReader, Limits};

use super::preprocess::Pixels;
use crate::error::{Error, Result};

/// The most pixels a source image may have: the earlier engine's bound
/// (64 Mi); PIL warns past 89 M and refuses past twice that.
pub const MAX_SOURCE_PIXELS: u64 = 1 << 26;

/// A decoded image and the size its file declares (the prompt's markup
/// names the original size).
pub struct Decoded {
    pub pixels: Pixels,
    pub width: usize,
    pub height: usize,
}

fn reader(bytes: &[u8]) -> Result<ImageReader<Cursor<&[u8]>>> {
    let reader =
        ImageReader::new(Cursor::new(bytes)).with_guessed_format().map_err(|e| Error::Arg(format!("image: {e}")))?;
    match reader.format() {
        Some(ImageFormat::Png | ImageFormat::Jpeg | ImageFormat::WebP | ImageFormat::Gif) => Ok(reader),
        Some(other) => Err(Error::Unsupported(format!("image format {other:?} (PNG, JPEG, WebP and GIF only)"))),
        None => Err(Error::Arg("not an image this engine reads (PNG, JPEG, WebP, GIF)".into())),
    }
}

/// The size an image file declares, from its header alone.
pub fn dimensions(bytes: &[u8]) -> Result<(usize, usize)> {
    let (w, h) = reader(bytes)?.into_dimensions().map_err(|e| Error::Arg(format!("image header: {e}")))?;
    Ok((w as usize, h as usize))
}

/// Decodes `bytes` (a whole file), refusing more than `max_pixels` pixels
/// before decoding and a malformed file with one line.
pub fn decode(bytes: &[u8], max_pixels: u64) -> Result<Decoded> {
    let header = reader(bytes)?;
    let gif = header.format() == Some(ImageFormat::Gif);
    let (w, h) = header.into_dimensions().map_err(|e| Error::Arg(format!("image header: {e}")))?;
    let pixels = u64::from(w) * u64::from(h);
    if pixels == 0 || pixels > max_pixels {
        return Err(Error::Arg(format!("image of {w}x{h} pixels: more than the {max_pixels} this engine decodes")));
    }
    let mut limits = Limits::default();
    limits.max_image_width = Some(w);
    limits.max_image_height = Some(h);
    // The decoded buffer at up to 16 bits a channel, and the decoder's own.
    limits.max_alloc = Some(pixels * 8 * 2 + (64 << 20));
    let mut r = reader(bytes)?;
    r.limits(limits);
    let img = r.decode().map_err(|e| Error::Arg(format!("image: {e}")))?;
    let (width, height) = (img.width() as usize, img.height() as usize);
    let rgba = img.color().has_alpha();
    let pixels = if rgba {
        let buf = img.to_rgba8();
        // A GIF frame is always RGBA here; PIL keeps it RGB unless the
        // file has a transparency entry, which shows as a transparent pixel.
        if gif && buf.pixels().all(|p| p.0[3] == 255) {
            Pixels::new(width, height, 3, image::DynamicImage::ImageRgba8(buf).to_rgb8().into_raw())?
        } else {
            Pixels::new(width, height, 4, buf.into_raw())?
        }
    } else {
        Pixels::new(width, height, 3, img.to_rgb8().into_raw())?
    };
    Ok(Decoded { pixels, width, height })
}
