//! `attend explain`: one attention computation, step by step, as the notebooks
//! print it, with its weights as terminal heatmaps; or every intermediate as one
//! JSON object; or the walkthrough as one HTML page with linked cells.

use std::path::PathBuf;

use attend::experiment;
use attend::viz::{self, ColorMode};
use attend::walkthrough;
use attend::Error;
use clap::ValueEnum;

use crate::args::experiment::{experiment, ExperimentArgs};
use crate::args::model::{ModelArgs, ModelRun};
use crate::io::console::{errln, out, outln};
use crate::io::outputs::Outputs;

/// Flags of `attend explain`.
#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    experiment: ExperimentArgs,
    #[command(flatten)]
    model: ModelArgs,
    /// With --model: the layer to walk through, from 0.
    #[arg(long, requires = "model")]
    layer: Option<usize>,
    /// With --model: the head to walk through, from 0.
    #[arg(long, requires = "model")]
    head: Option<usize>,
    /// Text walkthrough or one JSON object.
    #[arg(long, value_enum, default_value = "text")]
    format: Format,
    /// Also write the attention weights as a picture: FILE.svg or FILE.png.
    #[arg(long, value_name = "FILE")]
    heatmap: Option<PathBuf>,
    /// Write the walkthrough as one self-contained HTML page (every number linked
    /// to the numbers it is computed from) instead of printing it.
    #[arg(long, value_name = "FILE.html", conflicts_with = "format")]
    html: Option<PathBuf>,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum Format {
    Text,
    Json,
}

/// Runs `attend explain`.
pub fn run(args: Args) -> Result<(), Error> {
    let outputs = Outputs::new(&[
        ("--heatmap", args.heatmap.as_deref()),
        ("--html", args.html.as_deref()),
    ])?;
    if let Some(run) = args.model.run()? {
        return explain_model(&args, &run, outputs);
    }
    let exp = experiment(&args.experiment)?;
    let ex = experiment::run(&exp)?;
    let maps = ex.attention_maps("attend explain")?;
    outputs.write("--heatmap", |path| viz::write_heatmap(&maps, 0, path))?;
    if let Some(html) = &args.html {
        let page = walkthrough::experiment_page(&ex, &exp, "attend explain")?;
        return write_page(outputs, html, &page);
    }
    outputs.commit()?;
    match args.format {
        Format::Json => outln!("{}", ex.to_json())?,
        Format::Text => {
            out!(
                "{}",
                walkthrough::render(&walkthrough::experiment_steps(&ex, &exp))
            )?;
            out!("{}", walkthrough::heatmaps(&maps, 0, ColorMode::detect())?)?;
        }
    }
    Ok(())
}

/// One head of a real model, step by step like the notebooks, or as JSON with the
/// notebook keys (`x` is the layer's input).
fn explain_model(args: &Args, run: &ModelRun, outputs: Outputs) -> Result<(), Error> {
    let (Some(layer), Some(head)) = (args.layer, args.head) else {
        return Err(Error::value("--model needs --layer L and --head H"));
    };
    let t = run.trace.head(layer, head)?;
    let maps = run.maps()?;
    outputs.write("--heatmap", |path| viz::write_heatmap(&maps, layer, path))?;
    let steps = walkthrough::head_steps(t, &run.encoder.model.layers[layer].attention, head);
    if let Some(html) = &args.html {
        let title = format!("{}, layer {layer}, head {head}", run.title);
        let page = walkthrough::head_page(&steps, &run.trace.tokens, &title)?;
        return write_page(outputs, html, &page);
    }
    outputs.commit()?;
    match args.format {
        Format::Json => {
            let mut obj = serde_json::Map::new();
            obj.insert("tokens".into(), serde_json::json!(run.trace.tokens));
            obj.insert("layer".into(), layer.into());
            obj.insert("head".into(), head.into());
            for s in &steps {
                // Matrices, and the biases as matrices of one row, then unwrapped.
                let vector = s.value.ndim() == 1;
                let rows = match vector {
                    true => s.value.view().insert_axis(ndarray::Axis(0)),
                    false => s.value.view(),
                };
                let rows: ndarray::ArrayView2<f32> =
                    rows.into_dimensionality().expect("1-D and 2-D steps");
                let json = crate::io::model_dir::json_matrix(rows.rows());
                let mut value: serde_json::Value = serde_json::from_str(&json).expect("valid JSON");
                if vector {
                    value = value[0].take();
                }
                obj.insert(s.key.into(), value);
            }
            outln!("{}", serde_json::Value::Object(obj))?;
        }
        Format::Text => {
            outln!("{}, layer {layer}, head {head}", run.title)?;
            outln!("tokens: {:?}\n", run.trace.tokens)?;
            out!("{}", walkthrough::render(&steps))?;
            outln!("Attention weights, layer {layer}, head {head} (rows: queries, columns: keys)")?;
            let w = maps.layers[layer].index_axis(ndarray::Axis(0), head);
            out!(
                "{}",
                viz::terminal_heatmap(
                    w,
                    &maps.query_tokens,
                    &maps.key_tokens,
                    ColorMode::detect()
                )?
            )?;
        }
    }
    Ok(())
}

/// Writes `--html`'s page, puts every output in place and says where the page is.
fn write_page(outputs: Outputs, html: &std::path::Path, page: &str) -> Result<(), Error> {
    outputs.write("--html", |path| {
        std::fs::write(path, page).map_err(|e| Error::io(path, e))
    })?;
    outputs.commit()?;
    errln!("wrote {}", html.display());
    Ok(())
}
