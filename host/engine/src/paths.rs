//! A model named by its path: a container directory (`waste convert`'s
//! output) or a GGUF file, run in place (crate::in_place; a split file from
//! its first part). Every front end opens and plans through here, so each
//! takes both.

use std::path::Path;

use crate::container::Container;
use crate::error::Result;
use crate::plan::{plan, MemoryPlan, PlanRequest};

/// The container at `path`: a directory as converted, or a GGUF file seen
/// as its conversion as stored.
pub fn open_container(path: &Path) -> Result<Container> {
    if path.is_file() {
        return crate::in_place::open(path);
    }
    Container::open(path)
}

/// The plan for the model at `path`, read from its manifest (the trunk is
/// not loaded).
pub fn plan_path(path: &Path, request: &PlanRequest) -> Result<MemoryPlan> {
    plan(&open_container(path)?, request)
}

/// As [`plan_path`]; with `vision`, also for images through Kimi K3's tower
/// (`vision::plan::vision_bytes`; refused for a model without one).
pub fn plan_path_for_images(path: &Path, request: &PlanRequest, vision: bool) -> Result<MemoryPlan> {
    crate::vision::plan::plan_for_images(&open_container(path)?, request, vision)
}
