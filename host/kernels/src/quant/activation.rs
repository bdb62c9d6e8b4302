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
    /// gpt-oss: `gate = min(gate, limit)`, `up = clamp(up, -limit, limit)`,
    /// `(up + 1) * gate * sigmoid(alpha * gate)`.
    ClampedSwiglu { alpha: f32, limit: f32 },
    /// DeepSeek-V4: `silu(min(gate, limit)) * clamp(up, -limit, limit)`.
    ClampedSilu { limit: f32 },
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
            Activation::ClampedSwiglu { alpha, limit } => {
                // GptOssExperts: `gate.clamp(min=None, max=limit)`, `up.clamp(-limit, limit)`,
                // `glu = gate * torch.sigmoid(gate * alpha)`, `(up + 1) * glu`.
                let g = gate.min(limit);
                let u = up.clamp(-limit, limit);
                (u + 1.0) * (g * (1.0 / (1.0 + (-(g * alpha)).exp())))
            }
            Activation::ClampedSilu { limit } => {
                // DeepseekV4Experts._apply_gate: `gate.clamp(max=limit)`,
                // `up.clamp(min=-limit, max=limit)`, `act_fn(gate) * up`.
                let g = gate.min(limit);
                g / (1.0 + (-g).exp()) * up.clamp(-limit, limit)
            }
        }
    }
}
