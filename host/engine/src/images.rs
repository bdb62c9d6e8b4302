//! Images through an opened model: decoded, preprocessed with the
//! container's processor settings, run through the tower (read from the
//! container at the first image, then kept), and spliced into a prompt at
//! its placeholder tokens.

use std::sync::Arc;

use crate::config::VisionConfig;
use crate::error::{Error, Result};
use crate::model::Model;
use crate::source::TensorSource;
use crate::stats::StepStats;
use crate::transformer::{Splice, State};
use crate::vision::decode::{decode, MAX_SOURCE_PIXELS};
use crate::vision::expand_placeholders;
use crate::vision::preprocess::{preprocess, PreprocessConfig};
use crate::vision::tower::VisionTower;

/// One image, ready for a prompt.
#[derive(Debug, Clone, PartialEq)]
pub struct ImageRows {
    /// The size the file declares: the prompt's markup names it
    /// (`<|media_begin|>image {W}x{H}<|media_content|>…`).
    pub width: usize,
    pub height: usize,
    /// `[tokens, hidden]`: the projected rows, one prompt position each.
    pub rows: Vec<f32>,
    pub tokens: usize,
}

impl Model {
    /// The vision config when the model has a tower and the container
    /// holds it; None for text-only models.
    pub fn vision(&self) -> Option<&VisionConfig> {
        let v = self.container().config().k3.as_ref()?.vision.as_ref()?;
        self.container().has(&format!("{}.patch_embed.proj.weight", crate::config::VISION_TOWER)).then_some(v)
    }

    /// The container's `media_proc_cfg` (`PreprocessConfig::of_container`).
    pub fn image_preprocessing(&self) -> Result<PreprocessConfig> {
        PreprocessConfig::of_container(self.container())
    }

    fn tower(&self, cfg: &VisionConfig) -> Result<Arc<VisionTower>> {
        let mut slot = self.vision.lock().map_err(|_| Error::Runtime("the vision tower's lock is poisoned".into()))?;
        if let Some(t) = slot.as_ref() {
            return Ok(Arc::clone(t));
        }
        let tower = Arc::new(VisionTower::load(cfg, self.container())?);
        *slot = Some(Arc::clone(&tower));
        Ok(tower)
    }

    /// Prompt positions an image file will take, from its header and the
    /// processor's plan alone (no decoding, no tower).
    pub fn image_tokens(&self, bytes: &[u8]) -> Result<usize> {
        if self.vision().is_none() {
            return Err(Error::Unsupported("this model has no vision tower: text input only".into()));
        }
        let (w, h) = crate::vision::decode::dimensions(bytes)?;
        let cfg = self.image_preprocessing()?;
        Ok(crate::vision::preprocess::plan(w, h, &cfg).tokens(&cfg))
    }

    /// An image file's bytes (PNG, JPEG, WebP, GIF) to its rows: bounded in
    /// pixels before decoding, preprocessed as the release's processor does.
    pub fn encode_image(&self, bytes: &[u8]) -> Result<ImageRows> {
        let Some(cfg) = self.vision() else {
            return Err(Error::Unsupported("this model has no vision tower: text input only".into()));
        };
        let pre_cfg = self.image_preprocessing()?;
        if pre_cfg.patch_size != cfg.patch_size || pre_cfg.merge_kernel_size != cfg.merge.0 {
            return Err(Error::Runtime(format!(
                "the processor's patch {} / merge {} do not match the tower's {} / {}",
                pre_cfg.patch_size, pre_cfg.merge_kernel_size, cfg.patch_size, cfg.merge.0
            )));
        }
        let decoded = decode(bytes, MAX_SOURCE_PIXELS)?;
        let pre = preprocess(&decoded.pixels, &pre_cfg);
        let tower = self.tower(cfg)?;
        let rows = self.pool().install(|| tower.forward(&pre))??;
        let tokens = rows.len() / cfg.text_hidden;
        Ok(ImageRows { width: decoded.width, height: decoded.height, rows, tokens })
    }

    /// `forward` over a prompt whose placeholder tokens (one per image, in
    /// order) stand for `images`: each is expanded to its image's rows, so
    /// the state advances by the expanded length and, with
    /// `all_positions`, the logits are of every expanded position.
    pub fn forward_with_images(
        &self,
        state: &mut State,
        tokens: &[u32],
        images: &[&ImageRows],
        all_positions: bool,
    ) -> Result<(Vec<f32>, StepStats)> {
        if images.is_empty() {
            return self.forward(state, tokens, all_positions);
        }
        let Some(cfg) = self.vision() else {
            return Err(Error::Unsupported("this model has no vision tower: text input only".into()));
        };
        let counts: Vec<usize> = images.iter().map(|i| i.tokens).collect();
        let (expanded, at) = expand_placeholders(tokens, cfg.placeholder, &counts)?;
        let rows: Vec<f32> = images.iter().flat_map(|i| i.rows.iter().copied()).collect();
        self.forward_spliced(state, &expanded, Splice { at: &at, rows: &rows }, all_positions)
    }
}
