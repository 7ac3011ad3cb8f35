//! The report's markdown and CSV renderings.

use std::fmt::Write as _;

use super::{ConfigurationReport, Report, WorkloadReport};

impl Report {
    /// The mixed-set table, in markdown; empty with one workload.
    pub fn mixed_markdown(&self) -> String {
        if self.mixed.is_empty() {
            return String::new();
        }
        let names: Vec<&str> = self.workloads.iter().map(|w| w.name.as_str()).collect();
        let mut out = format!(
            "All workloads together (the mixed set: {}), each pass's generated tokens over its time:\n\n",
            names.join(", ")
        );
        out.push_str("| configuration | tok/s (median) | tok/s min–max | speedup |\n");
        out.push_str("|---|--:|--:|--:|\n");
        for m in &self.mixed {
            let _ = writeln!(
                out,
                "| {} | {:.1} | {:.1}–{:.1} | {} |",
                m.label,
                m.tokens_per_second.median,
                m.tokens_per_second.min,
                m.tokens_per_second.max,
                m.speedup
                    .map_or_else(|| "–".to_owned(), |s| format!("{s:.2}x")),
            );
        }
        out
    }

    /// The results table, in markdown.
    pub fn markdown_table(&self) -> String {
        let mut out = String::new();
        out.push_str(
            "| workload | configuration | tok/s (median) | tok/s min–max | speedup | ideal | efficiency | acceptance | accepted/draft round | rounds won per pass | drafting | verifying | output |\n",
        );
        out.push_str("|---|---|--:|--:|--:|--:|--:|--:|--:|---|--:|--:|---|\n");
        for workload in &self.workloads {
            for c in &workload.configurations {
                let plain = c.cascade.is_empty();
                let dash = || "–".to_owned();
                let _ = writeln!(
                    out,
                    "| {} | {} | {:.1} | {:.1}–{:.1} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                    workload.name,
                    c.label,
                    c.tokens_per_second.median,
                    c.tokens_per_second.min,
                    c.tokens_per_second.max,
                    c.speedup.map_or_else(dash, |s| format!("{s:.2}x")),
                    c.ideal_speedup.map_or_else(dash, |s| format!("{s:.2}x")),
                    c.efficiency.map_or_else(dash, percent),
                    if plain { dash() } else { percent(c.acceptance) },
                    if plain {
                        dash()
                    } else {
                        format!("{:.2}", c.mean_accepted_per_draft_round)
                    },
                    if plain {
                        dash()
                    } else {
                        self.rounds_won(c, ", ")
                    },
                    percent(c.draft_share),
                    percent(c.verify_share),
                    match (c.outputs_match, plain) {
                        (false, _) => "**DIFFERS**",
                        (true, true) => "baseline",
                        (true, false) if c.drawn_rounds > 0 => "drawn",
                        (true, false) => "same",
                    },
                );
            }
        }
        out
    }

    /// `lookup 59 (58%)` for each source: rounds won per measured pass, and share of rounds.
    fn rounds_won(&self, c: &ConfigurationReport, separator: &str) -> String {
        let passes = self.repeat.max(1) as f64;
        c.sources
            .iter()
            .map(|s| {
                format!(
                    "{} {:.0} ({})",
                    s.stats.name,
                    s.stats.won as f64 / passes,
                    percent(s.won_share)
                )
            })
            .collect::<Vec<_>>()
            .join(separator)
    }

    /// `results.md`: the setup, the table, any mismatches and the charts.
    pub fn markdown(&self, charts: &[(&str, &str)]) -> String {
        let mut out = String::from("# spechost bench\n\n");
        let _ = writeln!(
            out,
            "Model `{}` ({}), {} threads, context {} tokens, {}; {} measured pass(es) after {} warm-up pass(es){}.",
            self.model.display(),
            match self.prompt_style {
                "raw" => "raw prompts, continued",
                _ => "chat requests in its template",
            },
            self.threads,
            self.ctx_size,
            self.sampling,
            self.repeat,
            self.warmup,
            self.max_tokens_cap
                .map_or_else(String::new, |cap| format!(", max_tokens capped at {cap}"))
        );
        out.push_str(
            "tok/s counts generated tokens after each request's first over the time after it; speedup is the ratio of medians to plain decoding.\n\n",
        );
        if self.drawn_requests > 0 {
            let _ = writeln!(
                out,
                "{} decoding(s) verified drafts drawn at the temperature by rejection sampling: their outputs follow the target's distribution, not plain decoding's draw for the seed, and are not compared with it (`--draft-acceptance compare` keeps the check).\n",
                self.drawn_requests
            );
        }
        for workload in &self.workloads {
            let _ = writeln!(
                out,
                "- `{}`: {} requests from `{}`{}",
                workload.name,
                workload.requests,
                workload.path.display(),
                degenerate_note(workload)
            );
        }
        out.push('\n');
        out.push_str(&self.markdown_table());
        out.push('\n');
        let mixed = self.mixed_markdown();
        if !mixed.is_empty() {
            out.push_str(&mixed);
            out.push('\n');
        }
        if self.outputs_match {
            out.push_str("Every output matched plain decoding token for token.\n");
        } else {
            let _ = writeln!(
                out,
                "**{} output(s) differ from plain decoding:**\n",
                self.mismatches.len()
            );
            for m in &self.mismatches {
                let _ = writeln!(
                    out,
                    "- {} · {} · request `{}` (pass {}): first difference at token {}",
                    m.workload, m.configuration, m.request, m.pass, m.first_difference
                );
            }
        }
        let faults: Vec<String> = self
            .workloads
            .iter()
            .flat_map(|w| w.configurations.iter().map(move |c| (w, c)))
            .flat_map(|(w, c)| {
                c.sources
                    .iter()
                    .filter(|s| s.stats.faults > 0)
                    .map(move |s| {
                        format!(
                            "{} · {} · {}: {} faults",
                            w.name, c.label, s.stats.name, s.stats.faults
                        )
                    })
            })
            .collect();
        if !faults.is_empty() {
            out.push_str("\nSource faults (counted as empty proposals):\n\n");
            for fault in faults {
                let _ = writeln!(out, "- {fault}");
            }
        }
        out.push('\n');
        out.push_str(&self.verify_cost_markdown());
        out.push('\n');
        for (title, file) in charts {
            let _ = writeln!(out, "![{title}]({file})");
        }
        out
    }

    /// The verify cost curve of each workload, in markdown, with how the ideal speedup follows
    /// from it.
    pub fn verify_cost_markdown(&self) -> String {
        let mut out = format!(
            "Verify cost: one `llama_decode` of n tokens with logits at every position, after the workload's median-length prompt (median of {} runs). \
             `ideal` is the speedup the configuration's rounds would give if drafting and bookkeeping were free: committed tokens × cost(1) / Σ cost(tokens verified) over its rounds; `efficiency` is measured / ideal.\n",
            self.cost_repeat
        );
        for workload in &self.workloads {
            let curve = &workload.verify_cost;
            let _ = writeln!(
                out,
                "\n`{}`, context {} tokens:\n",
                workload.name, curve.context_tokens
            );
            out.push_str(&crate::bench::ceiling::points_markdown(&curve.points));
            if !curve.observed.is_empty() {
                let sizes: Vec<String> = curve
                    .observed
                    .iter()
                    .map(|size| format!("{} {:.2}x ({})", size.tokens, size.ratio, size.decodes))
                    .collect();
                let _ = writeln!(
                    out,
                    "\nThe workload's real verify decodes over this curve, by tokens (mean of each size's decodes over the curve's price for them; decodes seen, every configuration's together): {}.",
                    sizes.join(", ")
                );
            }
        }
        out
    }

    /// `requests.csv`: every request of every measured pass, with its degeneracy (`echo`,
    /// `loop` or empty), degenerate ones included.
    pub fn requests_csv(&self) -> String {
        let mut out = String::from(
            "workload,configuration,pass,request,degenerate,generated_tokens,generation_seconds,rounds,drafted,accepted\n",
        );
        for row in &self.requests {
            let fields = [
                row.workload.clone(),
                row.configuration.clone(),
                row.pass.to_string(),
                row.request.clone(),
                row.degeneracy
                    .map_or_else(String::new, |d| d.name().to_owned()),
                row.generated_tokens.to_string(),
                format!("{:.6}", row.generation_time.as_secs_f64()),
                row.rounds.to_string(),
                row.drafted.to_string(),
                row.accepted.to_string(),
            ];
            let row: Vec<String> = fields.iter().map(|f| csv_field(f)).collect();
            out.push_str(&row.join(","));
            out.push('\n');
        }
        out
    }

    /// `results.csv`: one row per workload and configuration, over the requests whose plain
    /// output is not degenerate (`requests` counts them; `degenerate` counts the others).
    pub fn csv(&self) -> String {
        let mut out = String::from(
            "workload,configuration,cascade,draft_max,requests,degenerate,generated_tokens,tok_s_median,tok_s_min,tok_s_max,speedup,ideal_speedup,efficiency,acceptance,mean_accepted_per_draft_round,mean_committed_per_round,draft_share,verify_share,rounds_won,outputs_match\n",
        );
        for workload in &self.workloads {
            for c in &workload.configurations {
                let passes = self.repeat.max(1) as u64;
                let rounds_won = c
                    .sources
                    .iter()
                    .map(|s| format!("{}={}", s.stats.name, s.stats.won / passes))
                    .collect::<Vec<_>>()
                    .join(";");
                let fields = [
                    workload.name.clone(),
                    c.label.clone(),
                    c.cascade.join(","),
                    c.max_draft_len.map_or_else(String::new, |k| k.to_string()),
                    (workload.requests - workload.degenerate.len()).to_string(),
                    workload.degenerate.len().to_string(),
                    c.generated_tokens.to_string(),
                    format!("{:.3}", c.tokens_per_second.median),
                    format!("{:.3}", c.tokens_per_second.min),
                    format!("{:.3}", c.tokens_per_second.max),
                    c.speedup.map_or_else(String::new, |s| format!("{s:.4}")),
                    c.ideal_speedup
                        .map_or_else(String::new, |s| format!("{s:.4}")),
                    c.efficiency.map_or_else(String::new, |s| format!("{s:.4}")),
                    format!("{:.4}", c.acceptance),
                    format!("{:.4}", c.mean_accepted_per_draft_round),
                    format!("{:.4}", c.mean_committed_per_round),
                    format!("{:.4}", c.draft_share),
                    format!("{:.4}", c.verify_share),
                    rounds_won,
                    c.outputs_match.to_string(),
                ];
                let row: Vec<String> = fields.iter().map(|f| csv_field(f)).collect();
                out.push_str(&row.join(","));
                out.push('\n');
            }
        }
        out
    }
}

/// `; 2 degenerate (20.0%: `e1` echo, `e7` loop), left out of the figures`, or nothing.
fn degenerate_note(workload: &WorkloadReport) -> String {
    if workload.degenerate.is_empty() {
        return String::new();
    }
    let which: Vec<String> = workload
        .degenerate
        .iter()
        .map(|d| format!("`{}` {}", d.request, d.degeneracy.name()))
        .collect();
    format!(
        "; {} degenerate ({}: {}), left out of the figures",
        workload.degenerate.len(),
        percent(workload.degenerate_share),
        which.join(", ")
    )
}

/// `fraction` as a percentage with one decimal.
fn percent(fraction: f64) -> String {
    format!("{:.1}%", 100.0 * fraction)
}

/// A CSV field, quoted (RFC 4180) when it holds a comma, a quote or a line break.
pub(in crate::bench) fn csv_field(field: &str) -> String {
    if field.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", field.replace('"', "\"\""))
    } else {
        field.to_owned()
    }
}
