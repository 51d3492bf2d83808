//! `attend explain`: one attention computation, step by step, as the notebooks
//! print it, with its weights as terminal heatmaps; or every intermediate as one
//! JSON object.

use std::path::PathBuf;

use attend::attention::SoftmaxAxis;
use attend::experiment::{self, Experiment, Explanation};
use attend::print::format_tensor;
use attend::viz::{self, AttentionMaps, ColorMode};
use attend::Error;
use clap::ValueEnum;
use ndarray::ArrayD;

use crate::experiment_args::{experiment, ExperimentArgs};
use crate::model_args::{ModelArgs, ModelRun};
use crate::outputs::Outputs;

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
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum Format {
    Text,
    Json,
}

/// Runs `attend explain`.
pub fn run(args: Args) -> Result<(), Error> {
    let outputs = Outputs::new(&[("--heatmap", args.heatmap.as_deref())])?;
    if let Some(run) = args.model.run()? {
        return explain_model(&args, &run, outputs);
    }
    let exp = experiment(&args.experiment)?;
    let ex = experiment::run(&exp)?;
    let maps = attention_maps(&ex)?;
    outputs.write("--heatmap", |path| viz::write_heatmap(&maps, 0, path))?;
    outputs.commit()?;
    match args.format {
        Format::Json => println!("{}", ex.to_json()),
        Format::Text => {
            print!("{}", walkthrough(&ex, &exp));
            print!("{}", heatmaps(&maps, ColorMode::detect())?);
        }
    }
    Ok(())
}

/// The experiment's attention weights, batch row 0, labelled by its tokens.
pub fn attention_maps(ex: &Explanation) -> Result<AttentionMaps, Error> {
    let labels = ex.labels();
    AttentionMaps::from_weights(
        ex.trace.attention.weights.view(),
        0,
        labels.clone(),
        labels,
        "attend explain".to_owned(),
    )
}

/// Every head's weights as a terminal heatmap.
fn heatmaps(maps: &AttentionMaps, style: ColorMode) -> Result<String, Error> {
    let mut out = String::new();
    for (h, w) in maps.layers[0].outer_iter().enumerate() {
        out.push_str(&format!(
            "Attention weights, head {h} (rows: queries, columns: keys)\n"
        ));
        out.push_str(&viz::terminal_heatmap(
            w,
            &maps.query_tokens,
            &maps.key_tokens,
            style,
        )?);
        out.push('\n');
    }
    Ok(out)
}

/// The notebook-style text: each step's name, shape and values.
fn walkthrough(ex: &Explanation, exp: &Experiment) -> String {
    let t = &ex.trace;
    let m = &ex.module;
    let mut out = String::new();
    let mut step = 0;
    let mut show = |title: &str, a: ArrayD<f32>| {
        step += 1;
        out.push_str(&format!(
            "Step {step}. {title}  shape {:?}\n{}\n\n",
            a.shape(),
            format_tensor(a.view())
        ));
    };
    if let Some(words) = &ex.words {
        show(
            &format!("x: embeddings of {words:?}"),
            ex.x.clone().into_dyn(),
        );
    } else {
        show("x: input", ex.x.clone().into_dyn());
    }
    show(
        "W_q [out, in]   (q = x W_qᵀ)",
        m.q_proj.weight.clone().into_dyn(),
    );
    show("W_k [out, in]", m.k_proj.weight.clone().into_dyn());
    show("W_v [out, in]", m.v_proj.weight.clone().into_dyn());
    for (name, proj) in [("b_q", &m.q_proj), ("b_k", &m.k_proj), ("b_v", &m.v_proj)] {
        if let Some(b) = &proj.bias {
            show(name, b.clone().into_dyn());
        }
    }
    show(
        "q = x W_qᵀ, split into heads [B, H, T, d_head]",
        t.q.clone().into_dyn(),
    );
    show("k = x W_kᵀ", t.k.clone().into_dyn());
    show("v = x W_vᵀ", t.v.clone().into_dyn());
    show("scores = q kᵀ", t.attention.scores.clone().into_dyn());
    let scale = exp.scale.unwrap_or(1.0 / (m.head_dim() as f32).sqrt());
    show(
        &format!("scaled = scores × {scale:.4} (masked entries -inf)"),
        t.attention.scaled.clone().into_dyn(),
    );
    let axis = match exp.softmax_axis {
        SoftmaxAxis::Keys => "keys (each row sums to 1)",
        SoftmaxAxis::Queries => "queries (each column sums to 1)",
    };
    show(
        &format!("weights = softmax(scaled) over {axis}"),
        t.attention.weights.clone().into_dyn(),
    );
    show(
        "context = weights v, heads concatenated",
        t.context.clone().into_dyn(),
    );
    if let (Some(o), Some(proj)) = (&t.output, &m.out_proj) {
        show("W_o [out, in]", proj.weight.clone().into_dyn());
        show("output = context W_oᵀ + b_o", o.clone().into_dyn());
    }
    out
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
    outputs.commit()?;
    let steps: [(&str, &str, ndarray::Array2<f32>); 8] = [
        ("x", "x: the layer's input (hidden states)", t.input),
        ("q", "q = x W_qᵀ + b_q, this head", t.q),
        ("k", "k = x W_kᵀ + b_k, this head", t.k),
        ("v", "v = x W_vᵀ + b_v, this head", t.v),
        ("scores", "scores = q kᵀ", t.scores),
        ("scaled", "scaled = scores / √d_head", t.scaled),
        (
            "weights",
            "weights = softmax(scaled) over keys (each row sums to 1)",
            t.weights,
        ),
        ("context", "context = weights v", t.output),
    ];
    match args.format {
        Format::Json => {
            let mut obj = serde_json::Map::new();
            obj.insert("tokens".into(), serde_json::json!(run.trace.tokens));
            obj.insert("layer".into(), layer.into());
            obj.insert("head".into(), head.into());
            for (key, _, a) in &steps {
                let json = crate::model_dir::json_matrix(a.rows());
                obj.insert(
                    (*key).into(),
                    serde_json::from_str(&json).expect("valid JSON"),
                );
            }
            println!("{}", serde_json::Value::Object(obj));
        }
        Format::Text => {
            println!("{}, layer {layer}, head {head}", run.title);
            println!("tokens: {:?}\n", run.trace.tokens);
            for (i, (_, title, a)) in steps.iter().enumerate() {
                println!(
                    "Step {}. {title}  shape {:?}\n{}\n",
                    i + 1,
                    a.shape(),
                    format_tensor(a.view().into_dyn())
                );
            }
            println!(
                "Attention weights, layer {layer}, head {head} (rows: queries, columns: keys)"
            );
            let w = maps.layers[layer].index_axis(ndarray::Axis(0), head);
            print!(
                "{}",
                viz::terminal_heatmap(
                    w,
                    &maps.query_tokens,
                    &maps.key_tokens,
                    ColorMode::detect()
                )?
            );
        }
    }
    Ok(())
}
