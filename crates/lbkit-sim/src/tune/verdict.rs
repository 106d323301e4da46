//! How a search's result is shown: the verdict, the configuration to apply, the ranking.

use std::fmt::Write as _;

use lbkit_strategy::catalog;

use super::{Objective, Tuning};
use crate::report::parse_label;

// === impl Tuning ===

impl Tuning {
    /// The verdict, a few lines: the winner, its gain with the interval, or why to keep the
    /// current setting.
    pub fn verdict(&self) -> String {
        let o = self.objective;
        let searched = self.ranking.len() - 1;
        if self.winner == self.current {
            return format!(
                "Keep {}: none of the {searched} candidates beat it on {} over the search's seeds ({}).",
                self.current,
                o.name(),
                o.show(self.gain.current)
            );
        }
        let g = &self.gain;
        if o == Objective::Errors && g.current == 0.0 && g.winner == 0.0 {
            return format!(
                "Keep {}: no request failed under it on {} fresh seeds, so there is nothing to \
                 gain on errors; a latency objective (--objective p99) ranks the candidates by \
                 speed.",
                self.current, g.seeds
            );
        }
        let change = |v: f64| match o {
            Objective::Errors => format!("{:+.2} pp", v * 100.0),
            _ => format!("{:+.1} %", v * 100.0),
        };
        let mut out = format!(
            "{} {}: {} against {} for {} (the current setting): {} (95 % interval {} to {}, \
             {} fresh seeds of {} requests, paired).",
            if g.is_clear() {
                "Winner"
            } else {
                "Ahead in the search"
            },
            self.winner,
            o.show(g.winner),
            o.show(g.current),
            self.current,
            change(g.change),
            change(g.low),
            change(g.high),
            g.seeds,
            self.requests
        );
        if !g.is_clear() {
            out.push_str(&format!(
                "\nNot clearly better: the interval includes no gain. Keep {}, or search longer \
                 (a larger --budget runs more requests per seed).",
                self.current
            ));
        }
        out
    }

    /// The configuration that applies the winner to `service`: the TOML of `lbkit proxy` and of
    /// a service config, and the proxy admin API's shadow and switch. Empty when the current
    /// setting won.
    pub fn snippet(&self, service: &str) -> String {
        if self.winner == self.current {
            return String::new();
        }
        let (name, params) = parse_label(&self.winner).expect("searched labels parse");
        let default = catalog::info(&name).map(|i| i.params).unwrap_or_default();
        let set: Vec<(&str, &str)> = params
            .pairs()
            .filter(|(k, v)| !default.iter().any(|p| p.name == *k && p.default == *v))
            .collect();
        let value = |v: &str| {
            if v.parse::<f64>().is_ok_and(f64::is_finite) {
                v.to_owned()
            } else {
                format!("{v:?}")
            }
        };
        let toml_params: Vec<String> = set
            .iter()
            .map(|(k, v)| format!("{k} = {}", value(v)))
            .collect();
        let json_params: Vec<String> = set
            .iter()
            .map(|(k, v)| format!("\"{k}\": {}", value(v)))
            .collect();
        let mut out = format!(
            "# proxy.toml (lbkit proxy), or a service config (lbkit::config)\n\
             [service.{}]\nstrategy = \"{name}\"\n",
            toml_key(service)
        );
        if !set.is_empty() {
            let _ = writeln!(out, "params = {{ {} }}", toml_params.join(", "));
        }
        if let Ok((_, Some(delay))) = crate::report::split_hedge(&self.winner, None) {
            let _ = write!(
                out,
                "# hedged at {delay} (idempotent requests; retries >= 1): in a service config,\n\
                 # call = {{ hedge = \"{delay}\" }}\n\
                 # in proxy.toml, hedge = \"{delay}\" on each [[route]] to this service\n"
            );
        }
        let body = if set.is_empty() {
            format!("{{\"strategy\": \"{name}\"}}")
        } else {
            format!(
                "{{\"strategy\": \"{name}\", \"params\": {{{}}}}}",
                json_params.join(", ")
            )
        };
        let _ = write!(
            out,
            "\n# or live, through the proxy's admin API (its [admin] bind; 127.0.0.1:9901 by\n\
             # default): shadow it first, then switch (the strategy; a hedge needs the config)\n\
             curl -X PUT localhost:9901/services/{service}/shadow -d '{body}'\n\
             curl localhost:9901/services/{service}/shadow\n\
             curl -X PUT localhost:9901/services/{service}/strategy -d '{body}'\n"
        );
        out
    }

    /// The ranking as aligned text: the best `top` candidates and the current setting.
    pub fn to_table(&self, top: usize) -> String {
        let o = self.objective;
        let w = self
            .ranking
            .iter()
            .map(|c| c.label.len())
            .max()
            .unwrap_or(9)
            .max(9);
        let p99 = o != Objective::P99;
        let mut out = format!(
            "{:>4}  {:w$}  {:>5}  {:>12}  {}{:>8}\n",
            "rank",
            "candidate",
            "seeds",
            o.name(),
            if p99 { "   p99 ms  " } else { "" },
            "failed %"
        );
        for (i, c) in self.ranking.iter().enumerate() {
            if i >= top && c.label != self.current {
                continue;
            }
            let value = match o {
                Objective::Errors => format!("{:.3} %", c.objective * 100.0),
                _ => format!("{:.2} ms", c.objective),
            };
            let _ = writeln!(
                out,
                "{:>4}  {:w$}  {:>5}  {:>12}  {}{:>8.3}{}",
                i + 1,
                c.label,
                c.seeds,
                value,
                if p99 {
                    format!("{:>9.2}  ", c.p99_ms)
                } else {
                    String::new()
                },
                c.failed * 100.0,
                match (c.label == self.current, c.fails_more) {
                    (true, _) => "  <- current",
                    (false, true) => "  (fails more)",
                    _ => "",
                }
            );
        }
        if self.ranking.len() > top + 1 {
            let _ = writeln!(
                out,
                "({} more in index.html and --format json)",
                self.ranking.len() - top - 1
            );
        }
        out
    }

    /// Pretty JSON of the search (without the comparison report).
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("a tuning always serialises")
    }
}

/// A TOML key: bare when it can be.
fn toml_key(key: &str) -> String {
    if !key.is_empty()
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
    {
        key.to_owned()
    } else {
        format!("{key:?}")
    }
}
