# Fixtures for the pytest suite: the `deltafin` binary to compare against ($DELTAFIN_BINARY,
# set by the CTest runner) and a tiny synthetic model with a tokenizer made once per session
# by `deltafin make-model --preset tiny` in a temporary folder.
import os
import subprocess

import pytest


@pytest.fixture(scope="session")
def binary():
    path = os.environ.get("DELTAFIN_BINARY")
    if not path or not os.path.exists(path):
        pytest.skip("DELTAFIN_BINARY is not set to the built deltafin program")
    return path


@pytest.fixture(scope="session")
def model_dir(binary, tmp_path_factory):
    d = tmp_path_factory.mktemp("model") / "tiny"
    subprocess.run([binary, "make-model", str(d), "--preset", "tiny", "--quiet"], check=True)
    return str(d)


OPTIONS = dict(threads=1, memory_budget="1G", ctx=2048)


@pytest.fixture(scope="session")
def model(model_dir):
    import deltafin
    m = deltafin.Model(model_dir, **OPTIONS)
    yield m
    m.close()
