//! The finished units of a long experiment (one method on one fold, say) in
//! `out/NAME/checkpoint.json`, each a labelled, typed value saved as it finishes, and the
//! per-unit driver every multi-method table runs through: kept from the checkpoint, else
//! computed, timed and stored. With `--resume`, a rerun of the same settings keeps the stored
//! units and computes only the rest, so a run of many hours can span several parts.

use std::fs;
use std::marker::PhantomData;
use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer, Serialize};

use super::report::{write_atomically, Run};

/// A unit's value and the wall seconds [`Checkpoint::unit`] spent computing it. Stored as one
/// JSON object: `seconds` beside the value's own fields.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Timed<T> {
    /// Wall seconds of the unit's computation (fit and evaluation).
    pub seconds: f64,
    /// The unit's value.
    #[serde(flatten)]
    pub value: T,
}

/// For `#[serde(deserialize_with = "or_nan")]` on an `f64` field that may be missing (NaN):
/// JSON has no NaN and `serde_json` writes it as `null`, which a plain `f64` refuses to read.
/// (±∞ are written as `null` too and come back as NaN.)
pub fn or_nan<'de, D: Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
    Ok(Option::<f64>::deserialize(d)?.unwrap_or(f64::NAN))
}

/// [`or_nan`] for every element of a `Vec<f64>`.
pub fn or_nan_vec<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<f64>, D::Error> {
    Ok(Vec::<Option<f64>>::deserialize(d)?.into_iter().map(|v| v.unwrap_or(f64::NAN)).collect())
}

/// [`or_nan`] for every element of an `[f64; N]`.
pub fn or_nan_array<'de, D: Deserializer<'de>, const N: usize>(d: D) -> Result<[f64; N], D::Error> {
    let v = or_nan_vec(d)?;
    let n = v.len();
    <[f64; N]>::try_from(v)
        .map_err(|_| serde::de::Error::invalid_length(n, &"as many numbers as the array holds"))
}

/// The wall seconds a checkpoint file records for the parts that stored units (`None`: a file
/// from before the time was stored) and how many parts there were (such a file: one).
fn recorded_time(file: &serde_json::Value) -> (Option<f64>, u64) {
    // Files written before the key was renamed call the parts "sittings".
    (file["seconds"].as_f64(), file["parts"].as_u64().or_else(|| file["sittings"].as_u64()).unwrap_or(1))
}

/// `"Wall time: N s (checkpoint.json)"`, or `"… summed over the K parts that stored units …"`,
/// from the text of a finished run's checkpoint file; `None` when it records no time.
pub fn recorded_wall_time(checkpoint: &str) -> Option<String> {
    let file: serde_json::Value = serde_json::from_str(checkpoint).ok()?;
    match recorded_time(&file) {
        (Some(secs), n) if n > 1 => Some(format!(
            "Wall time: {secs:.0} s summed over the {n} parts that stored units (checkpoint.json)"
        )),
        (Some(secs), _) => Some(format!("Wall time: {secs:.0} s (checkpoint.json)")),
        (None, _) => None,
    }
}

/// The units of type `T` a run has finished, under string keys, with the settings they were
/// computed under (see the module docs).
pub struct Checkpoint<T> {
    path: PathBuf,
    settings: serde_json::Value,
    done: serde_json::Map<String, serde_json::Value>,
    /// Wall seconds of the earlier parts that stored units (`None`: a file from before the
    /// time was stored), and how many parts there were.
    earlier: (Option<f64>, u64),
    /// Whether this part stored a unit (a `--resume` that only redraws counts no part).
    stored: bool,
    /// The start of this part (its [`Run`]'s).
    started: Instant,
    unit: PhantomData<fn() -> T>,
}

impl<T: Serialize + DeserializeOwned> Checkpoint<T> {
    /// The run's checkpoint. A fresh run ([`Run::new`]) starts empty (an old file is replaced at
    /// the first stored unit); a resumed one ([`Run::open`] with `append`) keeps the units an
    /// earlier run stored under equal `settings`, says how many in the log, and refuses a file
    /// of other settings with an error that names both.
    pub fn open(run: &mut Run, settings: &impl Serialize) -> Result<Self> {
        let settings = serde_json::to_value(settings)?;
        let path = run.path("checkpoint.json");
        let mut done = serde_json::Map::new();
        let mut earlier = (Some(0.0), 0);
        if run.resumed {
            match fs::read_to_string(&path) {
                Ok(text) => {
                    let old: serde_json::Value =
                        serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
                    if old["settings"] != settings {
                        anyhow::bail!(
                            "{} was written with settings {} but this run has {}; --resume only continues \
                             a run of the same settings",
                            path.display(),
                            old["settings"],
                            settings
                        );
                    }
                    done = old["done"]
                        .as_object()
                        .with_context(|| format!("{} has no \"done\" object", path.display()))?
                        .clone();
                    earlier = recorded_time(&old);
                }
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
            }
            run.log(format!("--resume: {} finished units kept from checkpoint.json", done.len()));
        }
        Ok(Self { path, settings, done, earlier, stored: false, started: run.started, unit: PhantomData })
    }

    /// The unit stored under `key`, if it is finished. A stored value this `T` cannot read (a
    /// file written by an older fspace, whose units were unlabelled lists of numbers) is an
    /// error that names the unit and says to rerun without `--resume`.
    pub fn get(&self, key: &str) -> Result<Option<T>> {
        let Some(v) = self.done.get(key) else { return Ok(None) };
        serde_json::from_value(v.clone()).map(Some).map_err(|e| {
            anyhow::anyhow!(
                "{}: unit {key:?} holds {v}, which this version cannot read ({e}); rerun without --resume",
                self.path.display()
            )
        })
    }

    /// Every unit of `keys` when all are finished, else `None` (a fold whose methods are all
    /// stored needs no data preparation).
    pub fn all<K: AsRef<str>>(&self, keys: impl IntoIterator<Item = K>) -> Result<Option<Vec<T>>> {
        keys.into_iter().map(|k| self.get(k.as_ref())).collect()
    }

    /// Whether `key` is finished.
    pub fn has(&self, key: &str) -> bool {
        self.done.contains_key(key)
    }

    /// Number of finished units.
    pub fn len(&self) -> usize {
        self.done.len()
    }

    /// Whether no unit is finished.
    pub fn is_empty(&self) -> bool {
        self.done.is_empty()
    }

    /// Stores `key` as finished and rewrites the file (a temporary file renamed over it, so an
    /// interrupted write leaves the previous version).
    pub fn put(&mut self, key: &str, unit: &T) -> Result<()> {
        self.done.insert(key.to_string(), serde_json::to_value(unit)?);
        self.stored = true;
        let text = serde_json::to_string_pretty(&serde_json::json!({
            "settings": self.settings, "done": self.done,
            "seconds": self.total_seconds(), "parts": self.earlier.1 + 1,
        }))?;
        write_atomically(&self.path, &(text + "\n"))
    }

    /// Wall seconds of every part so far, this one included (`None` when an earlier
    /// part's time was not recorded).
    pub fn total_seconds(&self) -> Option<f64> {
        self.earlier.0.map(|s| s + self.started.elapsed().as_secs_f64())
    }

    /// `"Wall time: N s"` for a run of one part; for one built over several, their sum and
    /// this part's share (the time between parts not counted). A `--resume` part that
    /// computed nothing is not counted as one; an earlier part whose time the file does not
    /// hold (written before the time was stored) is named as unrecorded, never counted as 0 s.
    pub fn wall_time(&self) -> String {
        let this = self.started.elapsed().as_secs_f64();
        let (earlier, n) = self.earlier;
        match (n, self.stored, earlier) {
            (0, _, _) => format!("Wall time: {this:.0} s"),
            (1, false, Some(e)) => format!("Wall time: {e:.0} s (this --resume computed nothing new)"),
            (n, false, Some(e)) => {
                format!("Wall time: {e:.0} s summed over {n} parts (this --resume computed nothing new)")
            }
            (n, true, Some(e)) => {
                format!("Wall time: {:.0} s summed over {} parts (--resume; this one {this:.0} s)", e + this, n + 1)
            }
            (n, stored, None) => format!(
                "Wall time: not recorded for the {n} earlier part(s) (checkpoint from before it was stored){}",
                if stored { format!("; this --resume part {this:.0} s") } else { String::new() }
            ),
        }
    }
}

impl<T: Serialize + DeserializeOwned> Checkpoint<Timed<T>> {
    /// The per-unit driver: the unit under `key` if it is stored (logged as kept), else
    /// `compute`'s value, timed and stored before it is returned.
    pub fn unit(
        &mut self,
        run: &mut Run,
        key: &str,
        compute: impl FnOnce(&mut Run) -> Result<T>,
    ) -> Result<Timed<T>> {
        self.unit_keeping(run, key, true, compute)
    }

    /// [`Checkpoint::unit`], keeping a stored unit only when `keep` holds (a unit that depends
    /// on another this part recomputes, say).
    pub fn unit_keeping(
        &mut self,
        run: &mut Run,
        key: &str,
        keep: bool,
        compute: impl FnOnce(&mut Run) -> Result<T>,
    ) -> Result<Timed<T>> {
        if !keep && self.has(key) {
            run.log(format!("{key}: stored, but computed again (what goes with it is not kept)"));
            return self.compute_and_store(run, key, compute);
        }
        self.unit_when(run, key, |_| true, compute)
    }

    /// [`Checkpoint::unit`], keeping a stored unit only when `current` says it was computed
    /// from what this part has (a network with the same fingerprint, say); a stale one is
    /// computed again and replaced, and the log says so.
    pub fn unit_when(
        &mut self,
        run: &mut Run,
        key: &str,
        current: impl FnOnce(&T) -> bool,
        compute: impl FnOnce(&mut Run) -> Result<T>,
    ) -> Result<Timed<T>> {
        match self.get(key)? {
            Some(stored) if current(&stored.value) => {
                run.log(format!("{key}: kept from checkpoint.json (--resume)"));
                return Ok(stored);
            }
            Some(_) => {
                run.log(format!("{key}: the stored unit is stale (its inputs changed); computed again"))
            }
            None => {}
        }
        self.compute_and_store(run, key, compute)
    }

    /// `compute`'s value, timed and stored under `key`.
    fn compute_and_store(
        &mut self,
        run: &mut Run,
        key: &str,
        compute: impl FnOnce(&mut Run) -> Result<T>,
    ) -> Result<Timed<T>> {
        let t = Instant::now();
        let value = compute(run)?;
        let unit = Timed { seconds: t.elapsed().as_secs_f64(), value };
        self.put(key, &unit)?;
        Ok(unit)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    struct Scores {
        #[serde(deserialize_with = "or_nan")]
        ell: f64,
        #[serde(deserialize_with = "or_nan")]
        acc: f64,
        #[serde(deserialize_with = "or_nan_vec")]
        trace: Vec<f64>,
    }

    fn scores(ell: f64) -> Scores {
        Scores { ell, acc: f64::NAN, trace: vec![0.1 + 0.2, f64::NAN] }
    }

    #[test]
    fn a_checkpoint_keeps_typed_units_across_parts_of_a_run_with_the_same_settings_only() {
        let out = std::env::temp_dir().join(format!("fspace-checkpoint-{}", std::process::id()));
        let out_s = out.to_str().unwrap();
        let settings = serde_json::json!({ "steps": 10 });
        let mut computed = 0;
        {
            let mut run = Run::new(out_s, "exp").unwrap();
            let mut ck = Checkpoint::<Timed<Scores>>::open(&mut run, &settings).unwrap();
            for key in ["set/fold 1/A", "set/fold 1/B"] {
                ck.unit(&mut run, key, |_| {
                    computed += 1;
                    Ok(scores(-0.5))
                })
                .unwrap();
            }
        }
        assert_eq!(computed, 2);
        let mut resumed = Run::open(out_s, "exp", true).unwrap();
        let mut ck = Checkpoint::<Timed<Scores>>::open(&mut resumed, &settings).unwrap();
        assert_eq!(ck.len(), 2);
        // A resume that computes nothing counts no part; one that stores a unit does.
        assert!(ck.wall_time().ends_with(" s (this --resume computed nothing new)"), "{}", ck.wall_time());
        let stored: serde_json::Value =
            serde_json::from_str(&fs::read_to_string(resumed.path("checkpoint.json")).unwrap()).unwrap();
        assert_eq!(stored["parts"], 1);
        assert!(stored["seconds"].as_f64().unwrap() <= ck.total_seconds().unwrap());
        // Units are labelled objects with their time.
        let a = &stored["done"]["set/fold 1/A"];
        assert_eq!(a["ell"], -0.5);
        assert!(a["acc"].is_null() && a["seconds"].as_f64().unwrap() >= 0.0);
        // The driver keeps a stored unit (exact round trip, NaN kept as NaN) and computes a new one.
        let kept = ck.unit(&mut resumed, "set/fold 1/A", |_| panic!("A is stored")).unwrap();
        assert_eq!((kept.value.ell, kept.value.trace[0]), (-0.5, 0.1 + 0.2));
        assert!(kept.value.acc.is_nan() && kept.value.trace[1].is_nan());
        let fresh = ck.unit_keeping(&mut resumed, "set/fold 1/B", false, |_| Ok(scores(2.0))).unwrap();
        assert_eq!(fresh.value.ell, 2.0);
        // A stale unit (by the caller's test) is replaced; a current one kept.
        let kept =
            ck.unit_when(&mut resumed, "set/fold 1/B", |s| s.ell == 2.0, |_| panic!("current")).unwrap();
        assert_eq!(kept.value.ell, 2.0);
        let redone =
            ck.unit_when(&mut resumed, "set/fold 1/B", |s| s.ell == 3.0, |_| Ok(scores(3.0))).unwrap();
        assert_eq!((redone.value.ell, ck.get("set/fold 1/B").unwrap().unwrap().value.ell), (3.0, 3.0));
        let log = fs::read_to_string(resumed.path("log.txt")).unwrap();
        assert!(log.contains("set/fold 1/B: the stored unit is stale"), "{log}");
        assert!(ck.wall_time().contains("summed over 2 parts"), "{}", ck.wall_time());
        assert!(ck.all(["set/fold 1/A", "set/fold 1/B"]).unwrap().is_some_and(|v| v[1].value.ell == 3.0));
        assert!(ck.all(["set/fold 1/A", "set/fold 2/A"]).unwrap().is_none());
        // Without --resume the old units and parts are not used.
        let fresh =
            Checkpoint::<Timed<Scores>>::open(&mut Run::new(out_s, "exp").unwrap(), &settings).unwrap();
        assert_eq!(fresh.len(), 0);
        assert!(fresh.wall_time().starts_with("Wall time: ") && !fresh.wall_time().contains("parts"));
        // A file from an older fspace: unlabelled numbers, no time. The time is named as
        // unrecorded, and the unit is refused with a clear error rather than misread.
        let legacy = serde_json::json!({ "settings": settings, "done": { "set/fold 1/A": [1.0, 2.0] } });
        fs::write(resumed.path("checkpoint.json"), legacy.to_string()).unwrap();
        let mut old =
            Checkpoint::<Timed<Scores>>::open(&mut Run::open(out_s, "exp", true).unwrap(), &settings)
                .unwrap();
        assert_eq!(old.total_seconds(), None);
        assert!(old.wall_time().contains("not recorded for the 1 earlier part"), "{}", old.wall_time());
        let err = old.get("set/fold 1/A").err().unwrap().to_string();
        assert!(err.contains("\"set/fold 1/A\"") && err.contains("rerun without --resume"), "{err}");
        old.put("set/fold 1/B", &Timed { seconds: 1.0, value: scores(1.0) }).unwrap();
        assert!(old.wall_time().contains("this --resume part"), "{}", old.wall_time());
        // Other settings are refused, naming both.
        let err = Checkpoint::<Timed<Scores>>::open(&mut resumed, &serde_json::json!({ "steps": 20 }))
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains("\"steps\":10") && err.contains("\"steps\":20"), "{err}");
        fs::remove_dir_all(&out).unwrap();
    }
}
