//! What images add to a memory plan (`waste plan --vision`): the tower's
//! weights, its buffers for the largest image the processor lets through,
//! and that image's rows. Here rather than in `plan`, which the model's
//! opening uses and which must not reach back into the tower.

use super::preprocess::PreprocessConfig;
use super::tower::activation_bytes;
use crate::container::Container;
use crate::error::{Error, Result};
use crate::plan::{plan, vision_tower_bytes, MemoryPlan, PlanRequest};

/// The plan of `container` for `request`; with `vision`, also for images
/// through Kimi K3's tower ([`vision_bytes`]; refused for a model without
/// one).
pub fn plan_for_images(container: &Container, request: &PlanRequest, vision: bool) -> Result<MemoryPlan> {
    let vision = match (vision, vision_bytes(container)?) {
        (false, _) => 0,
        (true, Some(b)) => b,
        (true, None) => return Err(Error::Unsupported("this model has no vision tower to plan for".into())),
    };
    plan(container, &PlanRequest { vision, ..*request })
}

/// What images add to a plan: the tower's weights as the model holds them
/// (the stored matrices, the position grid expanded to f32), the tower's
/// buffers for the largest image the processor lets through
/// (`tower::activation_bytes`) and that image's rows. None: the container
/// has no tower.
pub fn vision_bytes(container: &Container) -> Result<Option<u64>> {
    let Some(cfg) = container.config().k3.as_ref().and_then(|k| k.vision) else {
        return Ok(None);
    };
    let stored = vision_tower_bytes(container.manifest());
    if stored == 0 {
        return Ok(None);
    }
    let pre = PreprocessConfig::of_container(container)?;
    // Padding to whole merge cells adds at most a row and a column.
    let patches = pre.in_patch_limit + 2 * pre.patch_limit_on_one_side + 1;
    let grid = 4 * (cfg.pos_grid.0 * cfg.pos_grid.1 * cfg.hidden) as u64;
    let threads = crate::pool::default_threads();
    let buffers = activation_bytes(&cfg, patches, threads);
    let rows = 4 * (patches / 4 * cfg.text_hidden) as u64;
    Ok(Some(stored + grid + buffers + rows))
}
