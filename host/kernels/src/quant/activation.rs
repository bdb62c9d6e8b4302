//! The gated activations of MLPs and experts, shared by the kernels (which
//! apply them inside the expert forward) and the model (dense MLPs).

/// The gated activation of MLPs and experts: `act(gate, up)`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Activation {
    /// `silu(gate) * up`.
    Silu,
    /// `beta tanh(gate / beta) sigmoid(gate) * U`, with
    /// `U = lin tanh(up / lin)` when `linear_beta` is set, else `up`.
    Situ { beta: f32, linear_beta: Option<f32> },
}

impl Activation {
    #[inline]
    pub fn apply(self, gate: f32, up: f32) -> f32 {
        match self {
            Activation::Silu => gate / (1.0 + (-gate).exp()) * up,
            Activation::Situ { beta, linear_beta } => {
                let u = match linear_beta {
                    Some(l) => l * (up / l).tanh(),
                    None => up,
                };
                beta * (gate / beta).tanh() * (1.0 / (1.0 + (-gate).exp())) * u
            }
        }
    }
}
