//! Kimi K3's image input (issue 20): the files (`decode`), the release's
//! preprocessing bit for bit against Pillow and numpy (`preprocess`), and
//! the vision tower with its projector (`tower`), whose rows replace the
//! prompt's `<|media_pad|>` tokens (`Transformer::forward_spliced`); what
//! images add to a memory plan (`plan`). Nothing here names the opened
//! model, which holds its tower: the model's image methods come after it.

pub mod decode;
pub mod plan;
pub mod preprocess;
pub mod tower;

#[cfg(test)]
mod oracle;

use crate::error::{Error, Result};

/// The text that stands for one image in a K3 prompt (the release's
/// `make_image_prompt`): the original file size, then the one placeholder
/// the image's rows replace. Tokenized with special tokens recognised.
pub fn image_markup(width: usize, height: usize) -> String {
    format!("<|media_begin|>image {width}x{height}<|media_content|><|media_pad|><|media_end|>")
}

/// The prompt the text model runs: each image's one placeholder token
/// repeated once per row of that image (`counts[i]` rows for the i-th
/// placeholder), as the release's `_merge_input_ids_with_image_features`
/// expands it; with the indices the rows go to, ascending. Exactly one
/// placeholder per image, as the release requires.
pub fn expand_placeholders(tokens: &[u32], placeholder: u32, counts: &[usize]) -> Result<(Vec<u32>, Vec<usize>)> {
    let found = tokens.iter().filter(|&&t| t == placeholder).count();
    if found != counts.len() {
        return Err(Error::Arg(format!(
            "{found} image placeholder tokens ({placeholder}) for {} images: each image needs exactly one",
            counts.len()
        )));
    }
    let total: usize = counts.iter().sum();
    let mut out = Vec::with_capacity(tokens.len() - found + total);
    let mut at = Vec::with_capacity(total);
    let mut next = counts.iter();
    for &t in tokens {
        if t == placeholder {
            let n = next.next().copied().unwrap_or(0);
            at.extend(out.len()..out.len() + n);
            out.extend(std::iter::repeat_n(placeholder, n));
        } else {
            out.push(t);
        }
    }
    Ok((out, at))
}

#[cfg(test)]
mod tests {
    use super::expand_placeholders;

    #[test]
    fn each_placeholder_becomes_its_image_rows() {
        let (ids, at) = expand_placeholders(&[1, 9, 2, 9, 3], 9, &[2, 3]).unwrap();
        assert_eq!(ids, vec![1, 9, 9, 2, 9, 9, 9, 3]);
        assert_eq!(at, vec![1, 2, 4, 5, 6]);
    }

    #[test]
    fn a_placeholder_count_unlike_the_images_is_refused() {
        assert!(expand_placeholders(&[1, 9, 2], 9, &[2, 3]).is_err());
        assert!(expand_placeholders(&[1, 9, 9], 9, &[2]).is_err());
        assert!(expand_placeholders(&[1, 2], 9, &[]).is_ok());
    }
}
