//! `attend view`: look at attention weights in the terminal, as a picture, or as an
//! HTML page.
//!
//! The weights come from a notebook experiment (the same flags as `explain`) or
//! from an attention-maps JSON file (`{"title", "query_tokens", "key_tokens",
//! "layers": [layer][head][q][k]}`, see `attend::viz::AttentionMaps::from_json`).

use std::path::PathBuf;

use attend::experiment;
use attend::viz::{self, AttentionMaps, ColorMode};

use crate::args::experiment::{self as experiment_args, ExperimentArgs};
use crate::args::model::ModelArgs;
use crate::io::console::{errln, out};
use crate::io::outputs::Outputs;
use attend::{Error, Result};

/// Flags of `attend view`.
#[derive(clap::Args)]
pub struct Args {
    /// Attention maps as JSON: {"title", "query_tokens", "key_tokens", "layers": `[layer][head][query][key]`}.
    #[arg(long, value_name = "FILE", conflicts_with_all = ["input", "sentence", "tokens", "model"])]
    pub input_json: Option<PathBuf>,
    #[command(flatten)]
    experiment: ExperimentArgs,
    #[command(flatten)]
    model: ModelArgs,
    /// Write a self-contained HTML attention view (head view, model view) to this file.
    #[arg(long, value_name = "FILE.html")]
    pub html: Option<PathBuf>,
    /// Write a heatmap picture of one layer (one panel per head) to FILE.svg or FILE.png.
    #[arg(long, value_name = "FILE.svg|FILE.png")]
    pub heatmap: Option<PathBuf>,
    /// The layer shown by --heatmap and in the terminal.
    #[arg(long, default_value_t = 0)]
    pub layer: usize,
    /// Show only this head in the terminal (default: every head of the layer).
    #[arg(long)]
    pub head: Option<usize>,
    /// Terminal colours: auto (truecolor or 256 colours on a terminal, plain numbers
    /// otherwise or when NO_COLOR is set), truecolor, 256, never.
    #[arg(long, default_value = "auto", value_parser = ["auto", "truecolor", "256", "never"])]
    pub color: String,
}

/// Runs `attend view`.
pub fn run(args: Args) -> Result<()> {
    let maps = match (&args.input_json, args.model.run()?) {
        (Some(path), _) => AttentionMaps::read_json(path)?,
        (None, Some(run)) => run.maps()?,
        (None, None) => experiment::run(&experiment_args::experiment(&args.experiment)?)?
            .attention_maps("attend explain")?,
    };
    maps.check_layer(args.layer)?;
    if let Some(h) = args.head {
        maps.check_head(h)?;
    }
    let outputs = Outputs::new(&[
        ("--heatmap", args.heatmap.as_deref()),
        ("--html", args.html.as_deref()),
    ])?;
    outputs.write("--heatmap", |path| {
        viz::write_heatmap(&maps, args.layer, path)
    })?;
    outputs.write("--html", |path| viz::write_html(&maps, path))?;
    outputs.commit()?;
    for path in [&args.heatmap, &args.html].into_iter().flatten() {
        errln!("wrote {}", path.display());
    }
    if args.heatmap.is_none() && args.html.is_none() {
        out!(
            "{}",
            terminal(&maps, args.layer, args.head, mode(&args.color)?)?
        )?;
    }
    Ok(())
}

fn mode(color: &str) -> Result<ColorMode> {
    Ok(match color {
        "auto" => ColorMode::detect(),
        "truecolor" => ColorMode::TrueColor,
        "256" => ColorMode::Ansi256,
        "never" => ColorMode::Plain,
        other => {
            return Err(Error::value(format!(
                "--color {other}: use auto, truecolor, 256 or never"
            )))
        }
    })
}

/// Every requested head of `layer` as terminal heatmaps, each under a heading.
pub fn terminal(
    maps: &AttentionMaps,
    layer: usize,
    head: Option<usize>,
    style: ColorMode,
) -> Result<String> {
    let w = &maps.layers[layer];
    let heads: Vec<usize> = match head {
        Some(h) => vec![h],
        None => (0..maps.heads()).collect(),
    };
    let mut out = String::new();
    for h in heads {
        out.push_str(&format!("layer {layer}, head {h}:\n"));
        out.push_str(&viz::terminal_heatmap(
            w.index_axis(ndarray::Axis(0), h),
            &maps.query_tokens,
            &maps.key_tokens,
            style,
        )?);
    }
    Ok(out)
}
