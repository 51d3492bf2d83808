//! `--model DIR "sentence"`: a real encoder as the source of attention, shared by
//! `explain` and `view`.

use std::path::PathBuf;

use attend::models::{SentenceEncoder, SentenceTrace};
use attend::viz::AttentionMaps;
use attend::Error;

use crate::args::experiment::MODULE_FLAGS;
use crate::io::console::errln;

/// The flags that pick a real model and the text it reads.
#[derive(clap::Args, Debug)]
pub struct ModelArgs {
    /// A BERT-style checkpoint directory (config.json, model.safetensors,
    /// tokenizer.json), e.g. the one `scripts/fetch-model` prints.
    #[arg(long, value_name = "DIR", requires = "text",
          conflicts_with_all = ["input", "sentence", "tokens", "digits", "vocab_size", "embed_dim"],
          conflicts_with_all = MODULE_FLAGS)]
    pub model: Option<PathBuf>,
    /// The sentence the model reads (with --model).
    #[arg(value_name = "SENTENCE", requires = "model")]
    pub text: Option<String>,
}

/// A model's trace of one text.
pub struct ModelRun {
    /// The model (its weights are part of the walkthrough).
    pub encoder: SentenceEncoder,
    /// Every intermediate.
    pub trace: SentenceTrace,
    /// "model name — text", for titles.
    pub title: String,
}

impl ModelArgs {
    /// Runs the model when `--model` was given; warnings go to stderr.
    pub fn run(&self) -> Result<Option<ModelRun>, Error> {
        let (Some(dir), Some(text)) = (&self.model, &self.text) else {
            return Ok(None);
        };
        let encoder = SentenceEncoder::load(dir)?;
        let trace = encoder.trace(text)?;
        for w in &trace.warnings {
            errln!("warning: {w}");
        }
        Ok(Some(ModelRun {
            encoder,
            trace,
            title: format!("{} — {text}", attend::models::model_name(dir)),
        }))
    }
}

impl ModelRun {
    /// Every layer and head, for the pictures and the HTML view.
    pub fn maps(&self) -> Result<AttentionMaps, Error> {
        AttentionMaps::of_trace(&self.trace, &self.title)
    }
}

/// `--precision`: the precision of a real encoder's dense layers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum PrecisionArg {
    /// f32 weights and products.
    #[default]
    F32,
    /// Weights kept in bf16, products of bf16 numbers summed in f32.
    Bf16,
    /// Weights quantized to int8 (one scale per output), each input row to
    /// bytes with its own scale and zero point, products summed in i32.
    Int8,
}

impl From<PrecisionArg> for attend::attention::Precision {
    fn from(p: PrecisionArg) -> Self {
        match p {
            PrecisionArg::F32 => attend::attention::Precision::F32,
            PrecisionArg::Bf16 => attend::attention::Precision::Bf16,
            PrecisionArg::Int8 => attend::attention::Precision::Int8,
        }
    }
}

impl PrecisionArg {
    /// Says once, on stderr, what `--precision bf16` does where the instruction
    /// set the kernels run on has no bf16 products (AVX512-BF16) and no AMX
    /// tiles for them: there the bf16 numbers are widened to f32 for the f32
    /// kernels, so bf16 saves memory, not time (docs/design.md, "Precision").
    pub fn announce(self) {
        let isa = attend::kernels::Isa::detect();
        let faster = isa.has_bf16_products() || isa.has_bf16_tiles();
        if self == PrecisionArg::Bf16 && !faster {
            errln!(
                "note: --precision bf16 on {isa}, which has no bf16 products faster than f32 ones: the weights stay in bf16 (half the memory) and are widened to f32 for the f32 kernels: the speed of f32, not faster"
            );
        }
    }
}
