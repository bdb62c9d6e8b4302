//! Progress of [`crate::Model::open_with_progress`]: how much of the trunk
//! is resident, and the learned-hotlist preload. Opening a large model takes
//! seconds to minutes (the trunk is read through its mapping tensor by
//! tensor), so front ends want something to draw.

use std::cell::RefCell;
use std::collections::HashMap;

use crate::error::Result;
use crate::quant::QMatrix;
use crate::source::TensorSource;

/// One step of opening a model, reported to the caller's callback in order:
/// `Trunk` events with `loaded` rising to `total`, then, when the container
/// carries a usage file and the cache is on, `PreloadStarted` (what will be
/// read), a `Preloading` per record read, and `Preloaded`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpenProgress {
    /// Bytes of trunk tensors loaded so far, of `total` (the trunk's size on
    /// disk, equal to `MemoryUse::trunk` after open). The last `Trunk` event
    /// has `loaded == total`.
    Trunk { loaded: u64, total: u64 },
    /// The trunk is resident; the hottest experts of the learned hotlist,
    /// `records` of them (`bytes`), are being read into the cache.
    PreloadStarted { records: usize, bytes: u64 },
    /// `records` (`bytes`) of them read so far.
    Preloading { records: usize, bytes: u64 },
    /// The preload is done: `records` expert records (`bytes` of them) are
    /// now in the cache.
    Preloaded { records: usize, bytes: u64 },
}

/// A tensor source that reports each tensor it hands out as loaded.
pub(crate) struct CountingSource<'a> {
    inner: &'a dyn TensorSource,
    sizes: HashMap<String, u64>,
    total: u64,
    state: RefCell<Counting<'a>>,
}

struct Counting<'a> {
    loaded: u64,
    /// A tensor asked for twice (tied weights) counts once.
    seen: std::collections::HashSet<String>,
    progress: &'a mut dyn FnMut(&OpenProgress),
}

impl<'a> CountingSource<'a> {
    /// `tensors`: (name, bytes on disk) of every trunk tensor; `total`: the
    /// bytes of those that become resident (a table left on disk is never
    /// asked for as a matrix, so it is never counted).
    pub fn new(
        inner: &'a dyn TensorSource,
        tensors: impl IntoIterator<Item = (String, u64)>,
        total: u64,
        progress: &'a mut dyn FnMut(&OpenProgress),
    ) -> Self {
        let sizes: HashMap<String, u64> = tensors.into_iter().collect();
        progress(&OpenProgress::Trunk { loaded: 0, total });
        CountingSource {
            inner,
            sizes,
            total,
            state: RefCell::new(Counting { loaded: 0, seen: Default::default(), progress }),
        }
    }

    fn loaded(&self, name: &str) {
        let Some(&bytes) = self.sizes.get(name) else {
            return;
        };
        let mut st = self.state.borrow_mut();
        if st.seen.insert(name.to_string()) {
            st.loaded = (st.loaded + bytes).min(self.total);
            let event = OpenProgress::Trunk { loaded: st.loaded, total: self.total };
            (st.progress)(&event);
        }
    }

    /// Reports the trunk complete, should a resident tensor have reached
    /// the model some other way than `matrix` / `vector`.
    pub fn finish(self) {
        let st = self.state.into_inner();
        if st.loaded < self.total {
            (st.progress)(&OpenProgress::Trunk { loaded: self.total, total: self.total });
        }
    }
}

impl TensorSource for CountingSource<'_> {
    fn matrix(&self, name: &str) -> Result<QMatrix> {
        let m = self.inner.matrix(name)?;
        self.loaded(name);
        Ok(m)
    }

    fn vector(&self, name: &str) -> Result<Vec<f32>> {
        let v = self.inner.vector(name)?;
        self.loaded(name);
        Ok(v)
    }

    fn has(&self, name: &str) -> bool {
        self.inner.has(name)
    }

    // Forwarded so a table the source can leave on disk stays there.
    fn stored_rows(&self, name: &str) -> Option<Result<Box<dyn crate::source::StoredRows>>> {
        self.inner.stored_rows(name)
    }
}
