"""``fspace.Laplace``, part 2 of 6: the fitting routes."""

from __future__ import annotations

import math
from typing import Any, List, Optional, Tuple

import numpy as np

from ._convert import array2, dataset_size, gathered, is_array, reread_weights, tensors
from ._distributed import ONE_SHARD_EACH, _group, agree_on, agreed, step_reduce, weights_summary
from ._method_base import Progress, _Progress
from ._predictive import _split_batch, _torch
from ._torch import TorchModel
from ._laplace_settings import _LaplaceSettings, _shards, _streams, _structures_that


class _LaplaceFit(_LaplaceSettings):
    """Fitting: a loader's batches read, the curvature summed in Rust in memory, streamed batch
    by batch or sharded over a process group."""

    # -- data -----------------------------------------------------------------------------------

    def _batch(self, batch: Any) -> Tuple[Any, Any]:
        # laplace-torch hands a dict batch to the model whole (a HuggingFace model reads
        # input_ids, attention_mask, ...): so does the torch path, without the targets; a native
        # network takes the array under dict_key_x.
        on_torch = isinstance(self._spec, TorchModel)
        return _split_batch(batch, None if on_torch else self.dict_key_x, self.dict_key_y)

    def _loader_arrays(self, loader: Any) -> Tuple[np.ndarray, np.ndarray]:
        xs, ys = [], []
        for batch in loader:
            bx, by = self._batch(batch)
            xs.append(self._spec.inputs(bx, "X"))
            ys.append(self._targets(by))
        if not xs:
            raise ValueError("the data loader yielded no batch")
        return np.concatenate(xs), np.concatenate(ys)

    def _targets(self, y: Any) -> np.ndarray:
        a = array2(y, "y")
        if self.likelihood == "classification" and a.shape[1] > 1:
            raise ValueError(
                f"classification targets are class indices (n,), got an array of shape {a.shape}: for one-hot "
                "targets pass y.argmax(-1); per-position (token) targets are not implemented — reduce the sequence "
                "inside the model so that it returns (batch, classes)"
            )
        return a

    # -- fit --------------------------------------------------------------------------------------

    def fit(self, train_loader: Any, override: Any = True, progress_bar: bool = False, *,
            progress: Progress = None, process_group: Any = None) -> None:
        """Fits the curvature at the model's weights on every batch of ``train_loader``.

        Parameters
        ----------
        train_loader : DataLoader or iterable
            Batches ``(x, y)`` or dicts with the keys ``dict_key_x`` / ``dict_key_y``. fspace
            also takes ``fit(X, y)`` with arrays or tensors.
        override : bool, default True
            ``False`` adds this loader's curvature sums to the earlier fit's (``diag``, ``kron``,
            ``full``; also over the last layer, where laplace-torch refuses it).
        progress_bar : bool, default False
            A tqdm bar over the passes of the fit.
        process_group : torch.distributed group or mpi4py communicator, optional
            Sharded fitting: each process passes its own shard of the data, the float64 partial
            sums are all-reduced (``SUM``) over the group — once for ``diag``, ``kron`` and
            ``full``; per sum over the data for ``ekfac`` (factors, then eigenvalues) and
            ``lowrank`` (one ``p``-vector per Lanczos product, whose shard is held in memory) —
            and every process ends with the same posterior, the single-process one up to the
            order of the additions. The default is the default group when ``torch.distributed`` is
            initialised with more than one process; ``False`` fits each process on its own.
            ``len(train_loader.dataset)`` must be the number of points all shards hold together
            (a padding ``DistributedSampler`` is refused).

        Returns
        -------
        None
        """
        if isinstance(override, bool) and is_array(train_loader):
            raise ValueError("fit(X) without targets: give fit(X, y), or a loader of (x, y) batches")
        bar = _Progress(progress if progress is not None else progress_bar, "Laplace", unit="point")
        with self._lock:
            if override is False and not self._is_fitted():
                # laplace-torch's curvature starts at zero: adding to it is a first fit (its
                # continual-learning example fits every task with override=False).
                override = True
            previous, was_loaded = self._la, getattr(self, "_loaded", False)
            try:
                if override is not False and was_loaded:
                    # A loaded posterior is refitted from this object's settings (the
                    # structure's options, the subset of weights), never from the file's.
                    self._la = None
                self._take_current_weights(keep_sums=override is False)
                if not isinstance(override, bool):
                    # fspace's fit(X, y): the arrays are in memory already.
                    x, yy = self._spec.inputs(train_loader, "X"), self._targets(override)
                    la = self._build()
                    la.fit(x, yy, bar.callback)
                elif _streams(self.hessian_structure, self.subset_of_weights):
                    la = self._stream(train_loader, override, bar, _group(process_group))
                elif _group(process_group) is not None:
                    la = self._fit_sharded(train_loader, override, bar, _group(process_group))
                else:
                    if not override:
                        raise NotImplementedError(
                            f"fit(override=False) with hessian_structure={self.hessian_structure!r}: only the structures "
                            f"that sum over the data in one pass ({', '.join(_structures_that(0, self.subset_of_weights))}) "
                            "accumulate over several fits"
                        )
                    # EKFAC and low rank pass over the data several times: collected in memory.
                    x, yy = self._loader_arrays(train_loader)
                    self._check_count(train_loader, x.shape[0])
                    la = self._build()
                    la.fit(x, yy, bar.callback)
            except BaseException:
                # A failed or interrupted fit leaves the earlier posterior.
                self._la, self._loaded = previous, was_loaded
                raise
            finally:
                bar.close()
            self._report = la.report
            self._summarise(la)

    def _take_current_weights(self, keep_sums: bool) -> None:
        """The model's weights as they are now (laplace-torch reads them when it fits, so a
        model trained after this object was made — its continual-learning example — is fitted
        at its trained weights): the native engine's copy is taken again and the Rust object
        rebuilt on it; with ``keep_sums`` (``override=False``) the earlier streamed sums move to
        the new object, to which the new batches, at the new weights, are added."""
        if not reread_weights(self._spec, self.model):
            return
        self._args["state"] = tensors(self._spec.state)[0]
        earlier = None
        if keep_sums and self._la is not None:
            try:
                earlier = np.array(self._la.sums_flat())
            except RuntimeError:  # no streamed sums (an in-memory fit): nothing to carry
                earlier = None
        self._la = None
        if earlier is not None:
            la = self._build()
            la.begin_batches(True)
            la.set_sums_flat(earlier)

    def _fit_sharded(self, loader: Any, override: bool, bar: Any, group: Any) -> Any:
        """The structures that pass over the data more than once (``lowrank``, ``ekfac``) over
        shards: each process holds its own shard's arrays and every sum over the data — the
        factor sums, EKFAC's eigenvalues, each Lanczos product — is all-reduced as the fit
        forms it (``fspace_laplace::fit_sharded``)."""
        subset = self.subset_of_weights
        if not _shards(self.hessian_structure, subset):
            shard = sorted(set(_structures_that(0, subset)) | set(_structures_that(1, subset)))
            raise NotImplementedError(
                f"sharded fitting with hessian_structure={self.hessian_structure!r}; the structures that shard are "
                f"{', '.join(shard)}"
            )
        if not override:
            raise NotImplementedError(
                f"fit(override=False) with hessian_structure={self.hessian_structure!r}: only the structures that "
                f"sum over the data in one pass ({', '.join(_structures_that(0, subset))}) accumulate over several fits"
            )
        agree_on(group, self._shard_fingerprint(),
                 "the processes disagree on the model or the Laplace settings (hessian_structure, subset_of_weights, "
                 "rank, max_basis, sigma_noise, ...): give every process the same ones")
        x, yy = agreed(group, lambda: self._loader_arrays(loader))
        seen = int(group.all_reduce(np.array([float(x.shape[0])]), "sum")[0])
        self._check_count(loader, seen, sharded=True)
        la = self._build()
        la.fit(x, yy, bar.callback, reduce=step_reduce(group), process=(group.rank, group.size))
        return la

    def _shard_fingerprint(self) -> List[float]:
        """What every process of a sharded fit must share: a summary of the model's weights
        and the settings (their JSON, hashed)."""
        import hashlib
        import json

        a = self._args
        if isinstance(self._spec, TorchModel):
            weights = [self._spec.calls().params]
        else:
            weights = [values for _, values, _ in a["state"].values()]
        text = json.dumps({k: v for k, v in a.items() if k != "state"}, sort_keys=True, default=str)
        digest = hashlib.sha256(text.encode()).digest()
        return [*weights_summary(weights), *[float(int.from_bytes(digest[i:i + 6], "little")) for i in range(0, 24, 6)]]

    @staticmethod
    def _check_count(loader: Any, seen: int, sharded: bool = False) -> None:
        """laplace-torch scales by ``len(train_loader.dataset)``: a loader that visits fewer or
        more points than its dataset holds would scale wrongly, so it is refused (sharded: the
        points of every shard together)."""
        size = dataset_size(loader)
        if sharded and size is not None and size != seen:
            raise ValueError(
                f"the shards hold {seen} points together but the dataset has {size}: a DistributedSampler "
                "pads the shards to equal sizes with repeated points (or drops the tail with drop_last=True); "
                + ONE_SHARD_EACH
            )
        if not sharded and size is not None and size != seen:
            raise ValueError(
                f"the loader yielded {seen} points but its dataset has {size}: laplace-torch scales by "
                "len(train_loader.dataset); use a loader that visits every point once (drop_last=False, no sampler "
                "that repeats or skips points)"
            )

    def _stream(self, loader: Any, override: bool, bar: Any, group: Any = None) -> Any:
        """Sums the curvature batch by batch in Rust (``LaplaceSums``): one batch in memory at a
        time; with ``override=False`` the sums of the earlier streamed fit are added to. With a
        process ``group`` each process sums its own shard and the partial sums are all-reduced."""
        total = dataset_size(loader) or 0
        la: Any = None
        earlier: Optional[np.ndarray] = None
        if group is not None:
            # Every process takes part in the all-reduce, a shard without points included; the
            # earlier sums (override=False) are added once, after the reduction.
            la = self._build()
            if not override:
                la.begin_batches(False)
                earlier = np.array(la.sums_flat())
            la.begin_batches(True)
        seen = 0

        def converted() -> Any:
            nonlocal la, seen
            for batch in loader:
                bx, by = self._batch(batch)
                x = self._spec.inputs(bx, "X")
                y = self._targets(by)
                if la is None:
                    la = self._build()
                    la.begin_batches(override)
                seen += x.shape[0]
                if bar.callback is not None:
                    bar.callback(seen, max(total, seen), None, None)
                yield x, y

        failure: Optional[BaseException] = None
        try:
            # Batches smaller than a chunk per thread are gathered up to that many points
            # (`batch_target`, 512 by default on two threads) before they cross to Rust.
            for x, y in gathered(converted(), lambda: la.batch_target):
                la.add_batch(x, y)
            if la is None:
                raise ValueError("the data loader yielded no batch")
        except BaseException as e:  # noqa: BLE001 - re-raised below, after the other processes hear of it
            if group is None:
                raise
            failure = e
        if group is not None:
            seen = _all_reduce_sums(la, group, failure, earlier)
        self._check_count(loader, seen, sharded=group is not None)
        la.end_batches()
        return la

    def _summarise(self, la: Any) -> None:
        torch = _torch()
        log_lik, n_data, idx, weights = la.fit_summary()
        eig = la.curvature_eigenvalues()
        n_outputs = int(la.output_dim)
        sigma_fit = self._args["sigma_noise"]
        if self.likelihood == "regression":
            # laplace-torch's loss: ½ Σ (f − y)², from log p = −loss/σ² − n·d·log(σ√(2π)).
            loss = -(log_lik + n_data * n_outputs * math.log(sigma_fit * math.sqrt(2 * math.pi))) * sigma_fit**2
            unit = sigma_fit**2  # the curvature at σ = 1
        else:
            loss = -log_lik
            unit = 1.0
        self._fit = dict(
            loss=torch.as_tensor(loss, dtype=self._dtype),
            n_data=int(n_data),
            n_outputs=n_outputs,
            indices=np.asarray(idx, dtype=np.int64),
            mean=torch.as_tensor(np.asarray(weights)[np.asarray(idx, dtype=np.int64)], dtype=self._dtype),
            weights=torch.as_tensor(np.asarray(weights), dtype=self._dtype),
            eigenvalues=None if eig is None else torch.as_tensor(np.asarray(eig) * unit, dtype=self._dtype),
            sigma_fit=sigma_fit,
        )



def _all_reduce_sums(la: Any, group: Any, failure: Optional[BaseException], earlier: Optional[np.ndarray]) -> int:
    """All-reduces the partial sums over ``group`` and returns the points of every shard
    together. First the processes agree: a process whose pass failed, or sums of another layout
    (another model or settings), make every process raise instead of one of them waiting
    forever in the reduction."""
    flat = None if la is None or failure is not None else np.array(la.sums_flat())
    size = -1 if flat is None else flat.size
    # [failed, size, −size] reduced by MAX: failure anywhere, and min/max of the sizes.
    status = group.all_reduce(np.array([1.0 if flat is None else 0.0, float(size), float(-size)]), "max")
    if failure is not None:
        raise failure
    if status[0] > 0:
        raise RuntimeError("another process of the group failed during the sharded fit (its error is raised there)")
    if status[1] != size or -status[2] != size:
        raise ValueError(
            "the processes' partial sums differ in layout: every process must fit the same model with the same "
            "hessian_structure, subset_of_weights and settings"
        )
    assert flat is not None
    total = group.all_reduce(flat, "sum")
    seen = int(total[-1])
    if earlier is not None:
        total = total + earlier
    la.set_sums_flat(np.ascontiguousarray(total))
    return seen
