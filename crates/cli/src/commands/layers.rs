//! `roamdisk layers`: the layer kinds, their arguments and options.

use clap::Parser;

/// List every layer kind a stack spec can use, with its arguments and
/// options.
///
/// Example:
///   roamdisk layers
///   roamdisk layers --json
#[derive(Parser)]
#[command(verbatim_doc_comment)]
pub struct Args {
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
}

pub fn run(a: Args) -> anyhow::Result<()> {
    let reg = super::registry();
    if a.json {
        let v: Vec<_> = reg
            .kinds()
            .map(|k| {
                serde_json::json!({
                    "name": k.name, "summary": k.summary, "args": k.args, "wraps": k.wraps,
                    "options": k.options.iter().map(|(n, h)| serde_json::json!({"name": n, "help": h})).collect::<Vec<_>>(),
                })
            })
            .collect();
        outln!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    for k in reg.kinds() {
        let usage = k.usage(true);
        outln!("{usage}\n    {}", k.summary);
        for (n, h) in k.options {
            outln!("    {n}=VALUE  {h}");
        }
        outln!();
    }
    outln!(
        "Details: docs/layers/<name>.md. Stacks can also be TOML files: see docs/layers/README.md."
    );
    Ok(())
}
