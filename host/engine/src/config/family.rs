//! The model types this engine runs, one row each: every fact about a
//! model type that more than one part of the engine needs (the config
//! parser, the GGUF reader, `synth --like`, the converter's bundled
//! template, the server's tool-call and reasoning splitters, the tests
//! that walk every family). Adding a model type is its config parser's
//! file and one row here; every list of model types is derived from
//! [`FAMILIES`].
//!
//! A row is a `model_type` of config.json, not a [`Family`]: several
//! model types share one forward-pass path (DeepSeek-V3, V3.2 and GLM-5
//! are all `Family::DeepseekV3`) but differ in their GGUF name, their
//! release and their chat format.

use serde_json::Value;

use super::{deepseek, deepseek_v4, gqa, gqa_families, k3, kimi, qwen3_next, releases, Family, ModelConfig, Reader};
use crate::error::Result;

/// How a family's chat template writes a tool call (the syntaxes
/// `waste-server`'s `tools` module parses, each told by its own markers).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ToolSyntax {
    /// The template knows no tools.
    None,
    /// `<tool_call>{"name": .., "arguments": {..}}</tool_call>` (Qwen2.5, Qwen3).
    Hermes,
    /// `<tool_call><function=NAME><parameter=KEY>..` (Qwen3-Coder, Qwen3.5).
    QwenXml,
    /// `<tool_call>NAME<arg_key>KEY</arg_key><arg_value>..` (GLM-4.5 and later).
    GlmXml,
    /// `<minimax:tool_call><invoke name="NAME">..` (MiniMax-M2).
    MinimaxXml,
    /// DeepSeek's DSML blocks (V3.2, V4).
    Dsml,
    /// gpt-oss's harmony `commentary` messages to `functions.NAME`.
    Harmony,
    /// A syntax of the family's own that the server does not parse yet
    /// (DeepSeek-V3's `<｜tool▁call▁begin｜>`, Kimi's tool-call sections).
    Unparsed,
}

/// Where a family's chat format puts the model's reasoning.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reasoning {
    /// The release does not reason before answering.
    None,
    /// `<think>` ... `</think>` before the answer.
    ThinkTags,
    /// gpt-oss's harmony `analysis` channel.
    HarmonyAnalysis,
    /// Markup of the family's own (Kimi K3's `<|open|>think` blocks).
    Unparsed,
}

/// A released model of the type, whose own config `waste synth --like
/// NAME` builds a container for (config/releases.rs).
pub struct Release {
    /// The `--like` name.
    pub name: &'static str,
    pub config: fn() -> Value,
    /// Its experts are too big to write: only `--manifest-only` is offered.
    pub manifest_only: bool,
}

/// A chat template carried into a container whose source ships none.
pub struct BundledTemplate {
    pub text: &'static str,
    /// Where it comes from, as `waste convert` reports it.
    pub source: &'static str,
}

/// Everything said once about one `model_type`.
pub struct FamilyRow {
    /// config.json's `model_type`.
    pub model_type: &'static str,
    /// Other `model_type`s read exactly as this one (Kimi-K2 is DeepSeek-V3).
    pub aliases: &'static [&'static str],
    /// The forward-pass path.
    pub family: Family,
    parse: fn(&Reader<'_>, Family, &str) -> Result<ModelConfig>,
    /// llama.cpp's `general.architecture` for this type, where the GGUF
    /// reader reads it (llama.cpp writes Mixtral as `llama` with experts).
    pub gguf_arch: Option<&'static str>,
    pub releases: &'static [Release],
    pub bundled_template: Option<BundledTemplate>,
    pub tool_syntax: ToolSyntax,
    pub reasoning: Reasoning,
}

impl FamilyRow {
    /// Every `model_type` this row reads: its own, then its aliases.
    pub fn model_types(&self) -> impl Iterator<Item = &'static str> {
        std::iter::once(self.model_type).chain(self.aliases.iter().copied())
    }

    /// Reads a config.json whose `model_type` is `model_type` (this row's
    /// or one of its aliases).
    pub(super) fn parse(&self, r: &Reader<'_>, model_type: &str) -> Result<ModelConfig> {
        (self.parse)(r, self.family, model_type)
    }
}

const NO_RELEASE: &[Release] = &[];

/// The table. Order is the order lists are shown in.
pub static FAMILIES: &[FamilyRow] = &[
    FamilyRow {
        model_type: "qwen3_moe",
        aliases: &[],
        family: Family::Qwen3Moe,
        parse: gqa::parse,
        gguf_arch: Some("qwen3moe"),
        releases: NO_RELEASE,
        bundled_template: None,
        tool_syntax: ToolSyntax::Hermes,
        reasoning: Reasoning::ThinkTags,
    },
    FamilyRow {
        model_type: "olmoe",
        aliases: &[],
        family: Family::Olmoe,
        parse: gqa::parse,
        gguf_arch: Some("olmoe"),
        releases: NO_RELEASE,
        bundled_template: None,
        tool_syntax: ToolSyntax::None,
        reasoning: Reasoning::None,
    },
    FamilyRow {
        model_type: "mixtral",
        aliases: &[],
        family: Family::Mixtral,
        parse: gqa::parse,
        gguf_arch: Some("llama"),
        releases: NO_RELEASE,
        bundled_template: None,
        tool_syntax: ToolSyntax::None,
        reasoning: Reasoning::None,
    },
    FamilyRow {
        model_type: "kimi_linear",
        aliases: &[],
        family: Family::KimiLinear,
        parse: kimi::parse_config,
        gguf_arch: Some("kimi-linear"),
        releases: &[Release { name: "kimi-linear-48b", config: releases::kimi_linear_48b, manifest_only: false }],
        bundled_template: None,
        tool_syntax: ToolSyntax::Unparsed,
        reasoning: Reasoning::None,
    },
    FamilyRow {
        model_type: "deepseek_v3",
        aliases: &["kimi_k2"],
        family: Family::DeepseekV3,
        parse: deepseek::parse_config,
        gguf_arch: Some("deepseek2"),
        releases: NO_RELEASE,
        bundled_template: None,
        tool_syntax: ToolSyntax::Unparsed,
        reasoning: Reasoning::ThinkTags,
    },
    FamilyRow {
        model_type: "deepseek_v32",
        aliases: &[],
        family: Family::DeepseekV3,
        parse: deepseek::parse_config,
        gguf_arch: Some("deepseek32"),
        releases: &[Release { name: "deepseek-v3.2", config: releases::deepseek_v3_2, manifest_only: false }],
        // The release's chat format is Python (`encoding_dsv32.py`); the
        // one copy of llama.cpp's port is the chat-template corpus's, whose
        // rendering the corpus test holds to transformers'.
        bundled_template: Some(BundledTemplate {
            text: include_str!("../../../../tests/fixtures/chat_templates/llamacpp/deepseek-ai-DeepSeek-V3.2.jinja"),
            source: "llama.cpp's DeepSeek-V3.2 template (models/templates/deepseek-ai-DeepSeek-V3.2.jinja)",
        }),
        tool_syntax: ToolSyntax::Dsml,
        reasoning: Reasoning::ThinkTags,
    },
    FamilyRow {
        model_type: "glm_moe_dsa",
        aliases: &[],
        family: Family::DeepseekV3,
        parse: deepseek::parse_config,
        gguf_arch: Some("glm-dsa"),
        releases: &[Release { name: "glm-5", config: releases::glm_5, manifest_only: false }],
        bundled_template: None,
        tool_syntax: ToolSyntax::GlmXml,
        reasoning: Reasoning::ThinkTags,
    },
    FamilyRow {
        model_type: "kimi_k3",
        aliases: &[],
        family: Family::KimiLinear,
        parse: k3::parse_config,
        gguf_arch: None,
        releases: &[Release { name: "kimi-k3", config: releases::kimi_k3, manifest_only: true }],
        bundled_template: None,
        tool_syntax: ToolSyntax::Unparsed,
        reasoning: Reasoning::Unparsed,
    },
    FamilyRow {
        model_type: "qwen2_moe",
        aliases: &[],
        family: Family::Qwen2Moe,
        parse: gqa_families::parse,
        gguf_arch: Some("qwen2moe"),
        releases: NO_RELEASE,
        bundled_template: None,
        tool_syntax: ToolSyntax::None,
        reasoning: Reasoning::None,
    },
    FamilyRow {
        model_type: "glm4_moe",
        aliases: &[],
        family: Family::Glm4Moe,
        parse: gqa_families::parse,
        gguf_arch: Some("glm4moe"),
        releases: &[Release { name: "glm-4.6", config: releases::glm_4_6, manifest_only: false }],
        bundled_template: None,
        tool_syntax: ToolSyntax::GlmXml,
        reasoning: Reasoning::ThinkTags,
    },
    FamilyRow {
        model_type: "minimax_m2",
        aliases: &[],
        family: Family::MinimaxM2,
        parse: gqa_families::parse,
        gguf_arch: Some("minimax-m2"),
        releases: &[Release { name: "minimax-m2", config: releases::minimax_m2, manifest_only: false }],
        bundled_template: None,
        tool_syntax: ToolSyntax::MinimaxXml,
        reasoning: Reasoning::ThinkTags,
    },
    FamilyRow {
        model_type: "gpt_oss",
        aliases: &[],
        family: Family::GptOss,
        parse: gqa_families::parse,
        gguf_arch: Some("gpt-oss"),
        releases: &[Release { name: "gpt-oss-120b", config: releases::gpt_oss_120b, manifest_only: false }],
        bundled_template: None,
        tool_syntax: ToolSyntax::Harmony,
        reasoning: Reasoning::HarmonyAnalysis,
    },
    FamilyRow {
        model_type: "qwen3_next",
        aliases: &[],
        family: Family::Qwen3Next,
        parse: qwen3_next::parse,
        gguf_arch: Some("qwen3next"),
        releases: NO_RELEASE,
        bundled_template: None,
        tool_syntax: ToolSyntax::Hermes,
        reasoning: Reasoning::ThinkTags,
    },
    FamilyRow {
        model_type: "qwen3_5_moe",
        aliases: &[],
        family: Family::Qwen3Next,
        parse: qwen3_next::parse,
        gguf_arch: None,
        releases: &[Release { name: "qwen3.5-397b-a17b", config: releases::qwen3_5_397b, manifest_only: false }],
        bundled_template: None,
        tool_syntax: ToolSyntax::QwenXml,
        reasoning: Reasoning::ThinkTags,
    },
    FamilyRow {
        model_type: "qwen3_5_moe_text",
        aliases: &[],
        family: Family::Qwen3Next,
        parse: qwen3_next::parse,
        gguf_arch: Some("qwen35moe"),
        releases: NO_RELEASE,
        bundled_template: None,
        tool_syntax: ToolSyntax::QwenXml,
        reasoning: Reasoning::ThinkTags,
    },
    FamilyRow {
        model_type: "deepseek_v4",
        aliases: &[],
        family: Family::DeepseekV4,
        parse: deepseek_v4::parse_config,
        gguf_arch: None,
        releases: &[Release { name: "deepseek-v4-flash", config: releases::deepseek_v4_flash, manifest_only: false }],
        // The release ships `encoding_dsv4.py` and no Jinja template; this
        // port is ours, held to that encoder by tests/gen_deepseek_v4_template.py.
        bundled_template: Some(BundledTemplate {
            text: include_str!("../convert/templates/deepseek_v4.jinja"),
            source: "WASTE's port of DeepSeek-V4's encoding_dsv4.py (convert/templates/deepseek_v4.jinja)",
        }),
        tool_syntax: ToolSyntax::Dsml,
        reasoning: Reasoning::ThinkTags,
    },
];

/// The row that reads `model_type` (its own or an alias).
pub fn by_model_type(model_type: &str) -> Option<&'static FamilyRow> {
    FAMILIES.iter().find(|row| row.model_types().any(|t| t == model_type))
}

/// The row llama.cpp writes as `general.architecture` `arch`.
pub fn by_gguf_arch(arch: &str) -> Option<&'static FamilyRow> {
    FAMILIES.iter().find(|row| row.gguf_arch == Some(arch))
}

/// Every `model_type` a container can be converted from, aliases included.
pub fn model_types() -> impl Iterator<Item = &'static str> {
    FAMILIES.iter().flat_map(FamilyRow::model_types)
}

/// Every `general.architecture` the GGUF reader reads.
pub fn gguf_archs() -> impl Iterator<Item = &'static str> {
    FAMILIES.iter().filter_map(|row| row.gguf_arch)
}

/// Every release `waste synth --like` knows.
pub fn releases() -> impl Iterator<Item = &'static Release> {
    FAMILIES.iter().flat_map(|row| row.releases.iter())
}

/// The release named `name` (a `--like` name).
pub fn release(name: &str) -> Option<&'static Release> {
    releases().find(|r| r.name == name)
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;

    /// A name that two rows claimed would make the lookups above depend on
    /// the table's order.
    #[test]
    fn every_model_type_gguf_arch_and_release_name_is_claimed_once() {
        let mut seen = HashSet::new();
        for t in model_types() {
            assert!(seen.insert(t), "model_type {t} is in two rows");
        }
        let mut seen = HashSet::new();
        for a in gguf_archs() {
            assert!(seen.insert(a), "GGUF architecture {a} is in two rows");
        }
        let mut seen = HashSet::new();
        for r in releases() {
            assert!(seen.insert(r.name), "release {} is in two rows", r.name);
        }
    }

    /// A release's config must be read by the row that lists it.
    #[test]
    fn every_release_config_names_its_rows_model_type() {
        for row in FAMILIES {
            for release in row.releases {
                let config = (release.config)();
                let model_type = config.get("model_type").and_then(Value::as_str);
                assert_eq!(model_type, Some(row.model_type), "release {}", release.name);
            }
        }
    }
}
