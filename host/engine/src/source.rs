//! Where a model's dense weights come from. The forward pass is written
//! against [`TensorSource`], so the same code runs on an unquantised Hugging
//! Face checkpoint (the oracle tests) and on a converted container; the
//! routed experts come through `model::experts::ExpertProvider`.

use crate::error::{Error, Result};
use crate::quant::QMatrix;

/// The dense trunk, looked up by the checkpoint's own tensor names.
pub trait TensorSource {
    /// A 2-D weight `[rows = out_features, cols = in_features]` (the layout of
    /// `nn.Linear.weight`), in whatever trunk format the source stores.
    fn matrix(&self, name: &str) -> Result<QMatrix>;
    /// A 1-D f32 tensor (norm weights, biases, router bias).
    fn vector(&self, name: &str) -> Result<Vec<f32>>;
    fn has(&self, name: &str) -> bool;
    /// A tensor of any rank read as a `[rows, cols]` matrix in its row-major
    /// order: a conv kernel `[D, 3, 14, 14]` as `[D, 588]`, a position grid
    /// `[64, 64, D]` as `[4096, D]`. Sources that store it flattened already
    /// (containers) need only `matrix`.
    fn matrix_view(&self, name: &str, rows: usize, cols: usize) -> Result<QMatrix> {
        let m = self.matrix(name)?;
        if (m.rows(), m.cols()) != (rows, cols) {
            return Err(Error::Runtime(format!(
                "weight `{name}` is [{}, {}], expected [{rows}, {cols}]",
                m.rows(),
                m.cols()
            )));
        }
        Ok(m)
    }
    /// The rows of a stored matrix, read on demand from where the source
    /// keeps them (a container's trunk file), for a table the model leaves
    /// on disk; `None` when the source can only hand out whole matrices.
    fn stored_rows(&self, _name: &str) -> Option<Result<Box<dyn StoredRows>>> {
        None
    }
}

/// A matrix whose rows are read on demand instead of held in RAM (an
/// untied embedding table: one row per token).
pub trait StoredRows: Send + Sync {
    fn rows(&self) -> usize;
    fn cols(&self) -> usize;
    /// Row `r` dequantised into `out` (`cols` floats): the same values the
    /// resident matrix's row gives, bit for bit. `r < rows()` and
    /// `out.len() == cols()` are the caller's to check.
    fn read_row(&self, r: usize, out: &mut [f32]) -> Result<()>;
}
