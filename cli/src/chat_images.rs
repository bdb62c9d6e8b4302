//! The images of a `waste chat` conversation: each message's, in step with
//! the messages, so every turn can tell how far the session's tokens (in
//! which each image placeholder is expanded to the image's rows) cover the
//! template's fresh rendering (one placeholder per image), and which
//! images the rest of it needs attached.

use anyhow::{bail, Result};
use waste_host::{Image, Session};

/// How the session's tokens cover a rendering.
pub enum Cover {
    /// They are its first expanded positions: evaluate the rendering from
    /// `cut` on, attaching the images from `first_image` on.
    Prefix { cut: usize, first_image: usize },
    /// They are not: start over with every image.
    Replay,
}

/// Where `held` (expanded positions) ends within `full` (one `placeholder`
/// per image of `images`, in order).
pub fn cover(full: &[u32], held: &[u32], placeholder: Option<u32>, images: &[&Image]) -> Result<Cover> {
    let mut expanded = 0;
    let mut image = 0;
    for (i, &t) in full.iter().enumerate() {
        if expanded == held.len() {
            return Ok(if i < full.len() { Cover::Prefix { cut: i, first_image: image } } else { Cover::Replay });
        }
        let n = if Some(t) == placeholder {
            let Some(img) = images.get(image) else {
                bail!("the conversation renders more image placeholders than it holds images");
            };
            image += 1;
            img.tokens()
        } else {
            1
        };
        if expanded + n > held.len() || held[expanded..expanded + n].iter().any(|&h| h != t) {
            return Ok(Cover::Replay);
        }
        expanded += n;
    }
    Ok(Cover::Replay)
}

/// Attaches `images` to the session, in order.
pub fn attach_all(session: &mut Session, images: &[&Image]) {
    for image in images {
        session.attach(image);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_images_is_a_plain_prefix() {
        assert!(matches!(cover(&[1, 2, 3], &[1, 2], None, &[]).unwrap(), Cover::Prefix { cut: 2, first_image: 0 }));
        assert!(matches!(cover(&[1, 2, 3], &[1, 9], None, &[]).unwrap(), Cover::Replay));
        assert!(matches!(cover(&[1, 2], &[1, 2], None, &[]).unwrap(), Cover::Replay));
        assert!(matches!(cover(&[1, 2], &[], None, &[]).unwrap(), Cover::Prefix { cut: 0, first_image: 0 }));
    }
}
