"""The Python boundary of the function-space methods: one compiled class per method, made from
typed settings (checked once, when the object is made, each error naming its setting), fitting
one data-source type (``fspace._fspace.DataSource``), and declaring what it reads
(``capabilities``), which the Python layer asks instead of naming methods."""

import numpy as np
import pytest

import fspace
from fspace import _fspace
from fspace import kernels as K
from mlp_reference import tanh_mlp

STATE = tanh_mlp(np.random.default_rng(9), [1, 6, 1])
NET = (STATE, "tanh")
X = np.linspace(-1, 1, 20).reshape(-1, 1)
Y = np.sin(3 * X)
PRIOR = fspace.GPPrior(K.RBF(1.0, 0.5)).spec()


def native():
    from fspace._convert import tensors
    return _fspace.Network.native(tensors(STATE)[0], "tanh")


def test_each_method_declares_what_it_reads_and_the_python_classes_follow():
    want = {
        _fspace.FspLaplace: (True, False, True, False),
        _fspace.FspLaplacePosthoc: (False, True, False, True),
        _fspace.Gfsvi: (True, False, True, False),
        _fspace.Valla: (False, False, True, False),
        _fspace.Ella: (False, True, False, False),
        _fspace.ExactGp: (False, False, False, False),
    }
    for cls, (rows, batches, each_step, one_sum) in want.items():
        c = cls.capabilities
        assert (c.rows, c.batches, c.shards_each_step, c.shards_one_sum) == (rows, batches, each_step, one_sum), cls
        assert c.shards == (each_step or one_sum)
    assert fspace.FSPLaplace(NET, "regression", K.RBF(), epochs=1)._rust_class() is _fspace.FspLaplace
    post_hoc = fspace.FSPLaplace(NET, "regression", K.RBF(), train=False)
    assert post_hoc._rust_class() is _fspace.FspLaplacePosthoc
    assert fspace.ExactGP(K.RBF())._rust_class() is _fspace.ExactGp


def test_a_source_the_method_cannot_read_is_refused_before_any_row_is_read():
    reads = []

    def read(positions):
        reads.append(positions)
        return X[positions], Y[positions]

    valla = _fspace.Valla(likelihood="regression", settings={**_fspace.Valla.defaults(), "num_inducing": 4})
    with pytest.raises(ValueError, match=r"VaLLA does not read rows read by position \(DataSource.rows\); "
                                         r"it reads arrays in memory, process shards reduced every step"):
        valla.fit(_fspace.DataSource.rows(read, 20), network=native())
    gp = _fspace.ExactGp(likelihood="regression", prior=PRIOR, sigma_noise=0.1)
    with pytest.raises(ValueError, match="the exact GP does not read batches"):
        gp.fit(_fspace.DataSource.batches(lambda: iter([(X, Y)])))
    with pytest.raises(ValueError, match="does not read a process shard reduced every step"):
        gp.fit(_fspace.DataSource.memory(X, Y, reduce=lambda part, failed: part, process=(0, 1)))
    assert reads == []


def test_a_source_is_read_once_and_the_method_object_is_not_changed_by_a_fit():
    gp = _fspace.ExactGp(likelihood="regression", prior=PRIOR, sigma_noise=0.1)
    source = _fspace.DataSource.memory(X, Y)
    post, report = gp.fit(source)
    assert np.isfinite(report["log_marginal_likelihood"])
    with pytest.raises(ValueError, match="this DataSource has been read by a fit"):
        gp.fit(source)
    fsp = _fspace.FspLaplacePosthoc(likelihood="regression", prior=PRIOR, sigma_noise=0.1)
    held = fsp.settings
    box = {"lower": [-2.0], "upper": [2.0]}
    fsp.fit(_fspace.DataSource.memory(X, Y), network=native(), settings={"context_box": box})
    assert fsp.settings == held and held["context_box"] is None  # the box was for that fit alone


def test_the_network_is_checked_against_what_the_method_needs():
    gp = _fspace.ExactGp(likelihood="regression", prior=PRIOR)
    with pytest.raises(ValueError, match="the exact GP does not take a network"):
        gp.fit(_fspace.DataSource.memory(X, Y), network=native())
    with pytest.raises(ValueError, match="GFSVI needs a network"):
        _fspace.Gfsvi(likelihood="regression", prior=PRIOR).fit(_fspace.DataSource.memory(X, Y))
    with pytest.raises(ValueError, match=r"VaLLA does not take a GP prior \(its prior is the network's"):
        _fspace.Valla(likelihood="regression", prior=PRIOR)
    with pytest.raises(ValueError, match="FSP-Laplace needs a GP prior"):
        _fspace.FspLaplace(likelihood="regression")


# Settings are read into the method's Rust Config when the object is made: each error names the
# setting, a ValueError (not numpy's or pyo3's OverflowError from deep inside the fit).
BAD_SETTINGS = [
    ("negative batch_size", lambda: fspace.FSPLaplace(NET, "regression", K.RBF(), batch_size=-1),
     r"the FSP-Laplace setting batch_size = -1: a count cannot be negative"),
    ("negative n_context", lambda: fspace.FSPLaplace(NET, "regression", K.RBF(), n_context=-5),
     r"the FSP-Laplace setting n_context = -5: a count cannot be negative"),
    ("a nested setting", lambda: fspace.FSPLaplace(NET, "regression", K.RBF(), laplace={"max_rank": -1}),
     r"the FSP-Laplace setting laplace.max_rank = -1: a count cannot be negative"),
    ("a float count", lambda: fspace.VaLLA(NET, "regression", num_inducing=2.5),
     r"the VaLLA setting num_inducing = 2.5: it must be a whole number"),
    ("a string rate", lambda: fspace.GFSVI(NET, "regression", K.RBF(), gamma="big"),
     r"the GFSVI setting gamma = 'big': it must be a number"),
    ("ELLA's negative features", lambda: fspace.ELLA(NET, "regression", num_eigen=-2),
     r"the ELLA setting num_eigen = -2: a count cannot be negative"),
    ("a non-positive σ", lambda: fspace.VaLLA(NET, "regression", sigma_noise=-1.0),
     r"σ|sigma"),
    ("an unknown likelihood", lambda: fspace.GFSVI(NET, "poisson", K.RBF()),
     r'likelihood "poisson" is not "regression" or "classification"'),
    ("the exact GP's σ", lambda: fspace.ExactGP(K.RBF(), sigma_noise=0.0),
     r"σ|sigma"),
]


@pytest.mark.parametrize("what,make,message", BAD_SETTINGS, ids=[b[0] for b in BAD_SETTINGS])
def test_a_bad_setting_is_refused_when_the_object_is_made_and_named(what, make, message):
    with pytest.raises(ValueError, match=message):
        make()


class _Batches:
    """A loader-like iterable (iterated again for each pass) of ``(x, y)`` batches."""

    def __init__(self, batches):
        self.batches = batches

    def __iter__(self):
        return iter(list(self.batches))


def test_a_loader_whose_batches_change_width_is_refused_by_name():
    wide = (np.zeros((4, 2)), np.zeros((4, 1)))
    loader = _Batches([(X[:8], Y[:8]), wide])
    fsp = fspace.FSPLaplace(NET, "regression", K.RBF(), train=False)
    with pytest.raises(ValueError, match="batch 2 of the data loader has 2 input columns; the batches before it had 1"):
        fsp.fit(loader)
    # With the box given there is no box pass: Rust reads the batches and names the width.
    fsp = fspace.FSPLaplace(NET, "regression", K.RBF(), train=False, context_box={"lower": [-2.0], "upper": [2.0]})
    with pytest.raises(ValueError, match="batch 2 of the data loader has 2 input and 1 target columns; the batches "
                                         "before it had 1 and 1"):
        fsp.fit(loader)
    # ELLA's passes (count, Nyström rows, G) read the batches the same way.
    ella = fspace.ELLA(NET, "regression", num_points=6, num_eigen=3, prior={"Fixed": 1.0}, early_stopping=None)
    with pytest.raises(ValueError, match="batch 2 of the data loader has 2 input and 1 target columns"):
        ella.fit(loader)


def test_batches_pulled_by_rust_give_the_in_memory_posterior():
    """Post-hoc FSP-Laplace and ELLA over a loader of uneven batches (Rust pulls them, gathers
    the small ones to the in-memory fit's chunk): the posterior of the in-memory fit."""
    loader = _Batches([(X[i:i + 3], Y[i:i + 3]) for i in range(0, 20, 3)] + [(X[:0], Y[:0])])
    x_test = np.linspace(-1.5, 1.5, 7).reshape(-1, 1)
    box = {"lower": [-2.0], "upper": [2.0]}
    for make in (lambda: fspace.FSPLaplace(NET, "regression", K.RBF(1.0, 0.5), train=False, sigma_noise=0.1,
                                           context_box=box),
                 lambda: fspace.ELLA(NET, "regression", num_points=10, num_eigen=4, prior={"Fixed": 1.0},
                                     early_stopping=None, sigma_noise=0.1)):
        streamed, held = make(), make()
        streamed.fit(loader)
        held.fit(X, Y)
        for a, b in zip(streamed(x_test), held(x_test)):
            np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)


def test_changing_a_public_setting_remakes_the_compiled_object():
    fsp = fspace.FSPLaplace(NET, "regression", K.RBF(1.0, 0.5), epochs=2, sigma_noise=0.1,
                            context_box={"lower": [-2.0], "upper": [2.0]})
    first = fsp._compiled()
    assert fsp._compiled() is first  # made once
    fsp.train = False
    fsp.fit(X, Y)
    assert type(fsp._compiled()) is _fspace.FspLaplacePosthoc
    np.testing.assert_array_equal(fsp.model_state_dict()["0.weight"], STATE["0.weight"])  # not trained
    fsp.sigma_noise = 0.2
    assert fsp._compiled() is not first
