//! The CNN's per-image rules — forward trace, tangent and adjoint passes by explicit
//! cross-correlations, and the per-image layer statistics — the reference the batched GEMM
//! rules (`batched`) are tested against, and what the Jacobian and KFAC statistics use.

use super::*;

/// `out[o, y, x] += Σ_{i,ky,kx} w[o, i, ky, kx] · a[i, y + ky − pad, x + kx − pad]` (zero padding).
fn correlate(
    a: &[f64],
    w: &[f64],
    cin: usize,
    cout: usize,
    k: usize,
    pad: usize,
    h: usize,
    wd: usize,
    out: &mut [f64],
) {
    let (ho, wo) = (Layer::conv_out(h, k, pad), Layer::conv_out(wd, k, pad));
    for o in 0..cout {
        for i in 0..cin {
            for ky in 0..k {
                for kx in 0..k {
                    let wv = w[((o * cin + i) * k + ky) * k + kx];
                    if wv == 0.0 {
                        continue;
                    }
                    for y in 0..ho {
                        let yy = y + ky;
                        if yy < pad || yy - pad >= h {
                            continue;
                        }
                        let arow = &a[(i * h + yy - pad) * wd..(i * h + yy - pad + 1) * wd];
                        let orow = &mut out[(o * ho + y) * wo..(o * ho + y + 1) * wo];
                        for x in 0..wo {
                            let xx = x + kx;
                            if xx >= pad && xx - pad < wd {
                                orow[x] += wv * arow[xx - pad];
                            }
                        }
                    }
                }
            }
        }
    }
}

/// Adjoint of [`correlate`]: accumulates `∂w` (if given) and `∂a` (if given) from `δ`.
fn correlate_adjoint(
    a: &[f64],
    w: &[f64],
    delta: &[f64],
    cin: usize,
    cout: usize,
    k: usize,
    pad: usize,
    h: usize,
    wd: usize,
    mut gw: Option<&mut [f64]>,
    mut ga: Option<&mut [f64]>,
) {
    let (ho, wo) = (Layer::conv_out(h, k, pad), Layer::conv_out(wd, k, pad));
    for o in 0..cout {
        for i in 0..cin {
            for ky in 0..k {
                for kx in 0..k {
                    let widx = ((o * cin + i) * k + ky) * k + kx;
                    let mut acc = 0.0;
                    for y in 0..ho {
                        let yy = y + ky;
                        if yy < pad || yy - pad >= h {
                            continue;
                        }
                        let row = (i * h + yy - pad) * wd;
                        for x in 0..wo {
                            let xx = x + kx;
                            if xx >= pad && xx - pad < wd {
                                let d = delta[(o * ho + y) * wo + x];
                                acc += d * a[row + xx - pad];
                                if let Some(g) = ga.as_deref_mut() {
                                    g[row + xx - pad] += w[widx] * d;
                                }
                            }
                        }
                    }
                    if let Some(g) = gw.as_deref_mut() {
                        g[widx] += acc;
                    }
                }
            }
        }
    }
}

impl Cnn {
    pub(crate) fn trace(&self, image: &[f64]) -> Trace {
        let p = &self.params;
        let mut a = image.to_vec();
        let mut t = Trace { inputs: vec![], pre: vec![], argmax: vec![], output: vec![] };
        for layer in &self.layers {
            t.inputs.push(a.clone());
            match *layer {
                Layer::Conv { w, b, cin, cout, k, pad, h, wd, pool } => {
                    let (ho, wo) = (Layer::conv_out(h, k, pad), Layer::conv_out(wd, k, pad));
                    let mut z: Vec<f64> = (0..cout * ho * wo).map(|j| p[b + j / (ho * wo)]).collect();
                    correlate(&a, &p[w..b], cin, cout, k, pad, h, wd, &mut z);
                    let act: Vec<f64> = z.iter().map(|&v| self.act().value(v)).collect();
                    t.pre.push(z);
                    if pool {
                        let (hp, wp) = (ho / 2, wo / 2);
                        let mut idx = Vec::with_capacity(cout * hp * wp);
                        for c in 0..cout {
                            for y in 0..hp {
                                for x in 0..wp {
                                    let cands = [
                                        (2 * y, 2 * x),
                                        (2 * y, 2 * x + 1),
                                        (2 * y + 1, 2 * x),
                                        (2 * y + 1, 2 * x + 1),
                                    ];
                                    let best = cands
                                        .iter()
                                        .map(|&(yy, xx)| (c * ho + yy) * wo + xx)
                                        .fold(None, |m: Option<usize>, i| match m {
                                            Some(j) if act[j] >= act[i] => Some(j),
                                            _ => Some(i),
                                        })
                                        .expect("four candidates");
                                    idx.push(best);
                                }
                            }
                        }
                        a = idx.iter().map(|&i| act[i]).collect();
                        t.argmax.push(idx);
                    } else {
                        a = act;
                        t.argmax.push(vec![]);
                    }
                }
                Layer::Dense { w, b, fan_in, fan_out, last } => {
                    let z: Vec<f64> = (0..fan_out)
                        .map(|o| p[b + o] + (0..fan_in).map(|i| p[w + o * fan_in + i] * a[i]).sum::<f64>())
                        .collect();
                    a = if last { z.clone() } else { z.iter().map(|&v| self.act().value(v)).collect() };
                    t.pre.push(z);
                    t.argmax.push(vec![]);
                }
            }
        }
        t.output = a;
        t
    }

    /// `J(x)·u` for one image from its trace: the per-image reference of the batched tangent
    /// (`cnn::batched`'s tests).
    #[cfg_attr(not(test), allow(dead_code))]
    pub(crate) fn tangent(&self, t: &Trace, u: &[f64]) -> Vec<f64> {
        let p = &self.params;
        let mut ad: Vec<f64> = vec![0.0; t.inputs[0].len()];
        for (l, layer) in self.layers.iter().enumerate() {
            let a = &t.inputs[l];
            match *layer {
                Layer::Conv { w, b, cin, cout, k, pad, h, wd, pool } => {
                    let (ho, wo) = (Layer::conv_out(h, k, pad), Layer::conv_out(wd, k, pad));
                    let mut zd: Vec<f64> = (0..cout * ho * wo).map(|j| u[b + j / (ho * wo)]).collect();
                    correlate(&ad, &p[w..b], cin, cout, k, pad, h, wd, &mut zd);
                    correlate(a, &u[w..b], cin, cout, k, pad, h, wd, &mut zd);
                    let act_d: Vec<f64> =
                        zd.iter().zip(&t.pre[l]).map(|(d, &z)| self.act().slope(z) * d).collect();
                    ad = if pool { t.argmax[l].iter().map(|&i| act_d[i]).collect() } else { act_d };
                }
                Layer::Dense { w, b, fan_in, fan_out, last } => {
                    let zd: Vec<f64> = (0..fan_out)
                        .map(|o| {
                            u[b + o]
                                + (0..fan_in)
                                    .map(|i| p[w + o * fan_in + i] * ad[i] + u[w + o * fan_in + i] * a[i])
                                    .sum::<f64>()
                        })
                        .collect();
                    ad = if last {
                        zd
                    } else {
                        zd.iter().zip(&t.pre[l]).map(|(d, &z)| self.act().slope(z) * d).collect()
                    };
                }
            }
        }
        ad
    }

    /// Accumulates `J(x)ᵀ v` for one image into `grad`.
    pub(crate) fn adjoint(&self, t: &Trace, v: &[f64], grad: &mut [f64]) {
        self.adjoint_with(t, v, Some(grad), None);
    }

    /// The reverse pass for one image: accumulates `J(x)ᵀ v` into `grad` (if given) and/or
    /// records each layer's pre-activation gradient `∂/∂z_l` (if given; channel-major for
    /// convolutions, as `z`).
    fn adjoint_with(
        &self,
        t: &Trace,
        v: &[f64],
        mut grad: Option<&mut [f64]>,
        mut record: Option<&mut Vec<Vec<f64>>>,
    ) {
        let p = &self.params;
        if let Some(rec) = record.as_deref_mut() {
            rec.clear();
            rec.resize(self.layers.len(), Vec::new());
        }
        let mut delta = v.to_vec(); // cotangent of the current layer's output (post-activation)
        for (l, layer) in self.layers.iter().enumerate().rev() {
            let a = &t.inputs[l];
            match *layer {
                Layer::Dense { w, b, fan_in, fan_out, last } => {
                    if !last {
                        for (d, &z) in delta.iter_mut().zip(&t.pre[l]) {
                            *d *= self.act().slope(z);
                        }
                    }
                    let mut back = vec![0.0; fan_in];
                    for o in 0..fan_out {
                        if let Some(grad) = grad.as_deref_mut() {
                            grad[b + o] += delta[o];
                            for i in 0..fan_in {
                                grad[w + o * fan_in + i] += delta[o] * a[i];
                            }
                        }
                        for i in 0..fan_in {
                            back[i] += p[w + o * fan_in + i] * delta[o];
                        }
                    }
                    if let Some(rec) = record.as_deref_mut() {
                        rec[l] = delta;
                    }
                    delta = back;
                }
                Layer::Conv { w, b, cin, cout, k, pad, h, wd, pool } => {
                    let (ho, wo) = (Layer::conv_out(h, k, pad), Layer::conv_out(wd, k, pad));
                    let mut dz = vec![0.0; cout * ho * wo];
                    if pool {
                        for (j, &i) in t.argmax[l].iter().enumerate() {
                            dz[i] += delta[j];
                        }
                    } else {
                        dz.copy_from_slice(&delta);
                    }
                    for (d, &z) in dz.iter_mut().zip(&t.pre[l]) {
                        *d *= self.act().slope(z);
                    }
                    let gw = grad.as_deref_mut().map(|grad| {
                        for (j, d) in dz.iter().enumerate() {
                            grad[b + j / (ho * wo)] += d;
                        }
                        &mut grad[w..b]
                    });
                    let mut back = vec![0.0; cin * h * wd];
                    let need_input = l > 0;
                    if gw.is_some() || need_input {
                        correlate_adjoint(
                            a,
                            &p[w..b],
                            &dz,
                            cin,
                            cout,
                            k,
                            pad,
                            h,
                            wd,
                            gw,
                            need_input.then_some(&mut back[..]),
                        );
                    }
                    if let Some(rec) = record.as_deref_mut() {
                        rec[l] = dz;
                    }
                    delta = back;
                }
            }
        }
    }

    /// [`kfac_statistics`](Self::kfac_statistics) by the per-image rules, parallel over images:
    /// the independent reference of the batched version in the tests.
    #[cfg(test)]
    pub(crate) fn kfac_statistics_per_image(
        &self,
        x: &DMatrix<f64>,
        factors: &[DMatrix<f64>],
    ) -> Result<Vec<LayerStatistics>> {
        self.check_inputs(x)?;
        let (n, q) = (x.nrows(), self.output_dim());
        let k = crate::network::check_factors(factors, n, q)?;
        let infos = self.layer_infos();
        // Per image: (per layer: patches T × fan_in row-major, grads k·T × fan_out row-major).
        let per_image: Vec<Vec<(Vec<f64>, Vec<f64>)>> = Self::images(x)
            .par_iter()
            .enumerate()
            .map(|(i, img)| {
                let t = self.trace(img);
                let mut out: Vec<(Vec<f64>, Vec<f64>)> = self
                    .layers
                    .iter()
                    .enumerate()
                    .map(|(l, layer)| (self.patches(layer, &t.inputs[l]), Vec::new()))
                    .collect();
                let mut rec = Vec::new();
                for c in 0..k {
                    let v: Vec<f64> = (0..q).map(|o| factors[i][(o, c)]).collect();
                    self.adjoint_with(&t, &v, None, Some(&mut rec));
                    for (l, layer) in self.layers.iter().enumerate() {
                        match *layer {
                            Layer::Conv { cout, .. } => {
                                let positions = rec[l].len() / cout;
                                let g = &mut out[l].1;
                                for pos in 0..positions {
                                    g.extend((0..cout).map(|o| rec[l][o * positions + pos]));
                                }
                            }
                            Layer::Dense { .. } => out[l].1.extend_from_slice(&rec[l]),
                        }
                    }
                }
                out
            })
            .collect();
        Ok(infos
            .iter()
            .enumerate()
            .map(|(l, info)| {
                let t = info.positions();
                let mut inputs = Vec::with_capacity(n * t * info.fan_in);
                let mut grads = Vec::with_capacity(n * k * t * info.fan_out);
                for img in &per_image {
                    inputs.extend_from_slice(&img[l].0);
                    grads.extend_from_slice(&img[l].1);
                }
                LayerStatistics {
                    positions: t,
                    columns: k,
                    inputs: DMatrix::from_row_slice(n * t, info.fan_in, &inputs),
                    output_grads: DMatrix::from_row_slice(n * k * t, info.fan_out, &grads),
                }
            })
            .collect())
    }

    /// The layer's input as rows per output position: im2col patches (`T × C_in·k·k`,
    /// zero padding) for a convolution, the input vector for a dense layer.
    #[cfg(test)]
    fn patches(&self, layer: &Layer, a: &[f64]) -> Vec<f64> {
        match *layer {
            Layer::Dense { .. } => a.to_vec(),
            Layer::Conv { cin, k, pad, h, wd, .. } => {
                let (ho, wo) = (Layer::conv_out(h, k, pad), Layer::conv_out(wd, k, pad));
                let mut out = Vec::with_capacity(ho * wo * cin * k * k);
                for y in 0..ho {
                    for x in 0..wo {
                        for i in 0..cin {
                            for ky in 0..k {
                                for kx in 0..k {
                                    let (yy, xx) = (y + ky, x + kx);
                                    let inside = yy >= pad && yy - pad < h && xx >= pad && xx - pad < wd;
                                    out.push(if inside {
                                        a[(i * h + yy - pad) * wd + xx - pad]
                                    } else {
                                        0.0
                                    });
                                }
                            }
                        }
                    }
                }
                out
            }
        }
    }
}
