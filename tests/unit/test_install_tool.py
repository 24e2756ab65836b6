"""tools/install.py, what `make install` and the package check install with: uv given
pip's own settings, and pip where uv cannot be had or fails (issue 50)."""

import os
import stat
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "tools"))

import install  # noqa: E402

LISTING = """\
:env:.find-links='/from/env'
:env:.cert='/etc/ssl/certs/ca-certificates.crt'
global.find-links='/from/file'
global.constraint='/etc/caps.txt'
global.extra-index-url='file:///nowhere/simple https://mirror.example/simple'
install.index-url="https://pypi.example/simple"
freeze.find-links='/not/for/install'
not a setting
"""


def test_pips_settings_are_read_as_pip_install_reads_them():
    settings = install.pip_settings(LISTING)
    assert settings["find-links"] == "/from/env"  # PIP_FIND_LINKS beats the file
    assert settings["constraint"] == "/etc/caps.txt"
    assert settings["index-url"] == "https://pypi.example/simple"  # [install] applies, quotes gone
    assert "freeze" not in str(settings) and "not a setting" not in str(settings)


def test_uv_gets_pips_sources_and_picks_the_best_version_among_them_as_pip_does(tmp_path):
    local_index = tmp_path / "simple"
    local_index.mkdir()
    settings = dict(install.pip_settings(LISTING), **{"extra-index-url": "file://%s file:///nowhere/simple" % local_index})
    options, env = install.uv_options(settings)
    assert options == ["--find-links", "/from/env", "--constraint", "/etc/caps.txt",
                       "--index-strategy", "unsafe-best-match"]
    # The indexes by environment (a URL may hold a password: not in ps, not in the line said on failure).
    assert env == {"UV_INDEX_URL": "https://pypi.example/simple",
                   "UV_EXTRA_INDEX_URL": "file://%s" % local_index,  # the missing one dropped, as pip does
                   "SSL_CERT_FILE": "/etc/ssl/certs/ca-certificates.crt"}
    assert install.uv_options({}) == ([], {})  # no settings: uv's defaults (PyPI), no strategy to match


def _script(path, body):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


def _setup(tmp_path, monkeypatch, uv_exit):
    """A venv whose python writes down what it was asked, and a fetched uv that does too, then exits uv_exit."""
    venv, uv_home, log = tmp_path / "venv", tmp_path / "uv", tmp_path / "calls"
    _script(venv / "bin" / "python", 'echo "python $*" >> %s\n' % log)
    _script(uv_home / "bin" / "uv", 'echo "uv $*" >> %s\nexit %d\n' % (log, uv_exit))
    (uv_home / ".complete").write_text("")
    monkeypatch.setattr(install, "UV_HOME", str(uv_home))
    return str(venv), log


def test_uv_installs_into_the_venv_and_pip_is_not_run(tmp_path, monkeypatch, capsys):
    venv, log = _setup(tmp_path, monkeypatch, uv_exit=0)
    assert install.install(venv, ["-r", "requirements-dev.txt"]) == 0
    (call,) = log.read_text().splitlines()
    assert call.startswith("uv pip install --quiet --python %s/bin/python " % venv)
    assert call.endswith(" -r requirements-dev.txt")
    assert capsys.readouterr().err == ""


def test_where_uv_fails_pip_installs_the_same_after_one_line_that_says_so(tmp_path, monkeypatch, capsys):
    venv, log = _setup(tmp_path, monkeypatch, uv_exit=3)
    assert install.install(venv, ["-e", "."]) == 0  # the fake python's pip "succeeds"
    calls = log.read_text().splitlines()
    assert calls[0].startswith("uv pip install ") and calls[0].endswith(" -e .")
    assert calls[-1] == "python -m pip install --quiet --no-compile -e ."
    err = capsys.readouterr().err
    assert err.count("tools/install.py: uv failed (exit 3: ") == 1 and "pip installs instead" in err


def test_where_uv_cannot_be_fetched_pip_installs(tmp_path, monkeypatch, capsys):
    venv, log = _setup(tmp_path, monkeypatch, uv_exit=0)
    os.remove(os.path.join(install.UV_HOME, ".complete"))
    fetch = install.uv_binary
    monkeypatch.setattr(install, "uv_binary", lambda: fetch("/bin/false"))  # a python whose pip fails
    assert install.install(venv, ["pkg==1"]) == 0
    assert log.read_text().splitlines()[-1] == "python -m pip install --quiet --no-compile pkg==1"
    assert "uv %s could not be fetched" % install.UV_VERSION in capsys.readouterr().err


def test_a_folder_that_is_no_venv_is_refused(tmp_path, capsys):
    assert install.install(str(tmp_path), ["pkg==1"]) == 2
    assert "is not a venv" in capsys.readouterr().err
