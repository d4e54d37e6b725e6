"""trainctl's bootstrap: loaded by Python's ``site`` at start-up in a trainer that trainctl
runs (its directory is first on ``PYTHONPATH``).  Standard library only; it must cost
nothing and change nothing in a script that imports none of the watched libraries.

At start-up it
* takes its directory off ``sys.path`` and ``PYTHONPATH`` again (child interpreters, such
  as spawned DataLoader workers, start without it) and pops ``TRAINCTL_INSTRUMENT``;
* installs an import hook (first on ``sys.meta_path``) that watches the top-level modules
  named there; nothing else is imported;
* runs the ``sitecustomize`` the user's path would have given (chained, as if first).

Under torchrun (``TRAINCTL_FLIGHT_DIR`` set, see ``trainctl_flight``): the launcher keeps
the bootstrap on ``PYTHONPATH`` so that its ranks load it too; each rank takes it off (its
DataLoader workers start without it), pops ``TRAINCTL_FLIGHT_DIR`` and answers requests
for its Flight Recorder (``trainctl_flight.start``).

When the script imports a watched module (``ultralytics``, ...), the module runs as usual;
then the hook makes trainctl importable (``path``: a directory the agent made that holds
only a ``trainctl`` package of links to its own code, first on sys.path; never trainctl's
whole site-packages, which would shadow the user's torch), imports
``trainctl.inside.<integration>`` and calls its ``attach(module)``.  Whatever happens is said on the side channel
(``TRAINCTL_EVENTS_PATH``) as an info event: ``instrument.attached.<integration>``,
``instrument.refused`` or ``instrument.failed``; a failure leaves the script unaltered.

``TRAINCTL_INSTRUMENT`` (JSON, written by trainctl.agent.zero_code):
``{"watch": {module: integration}, "path": directory, "fallback": directory}``;
``fallback``: links to the pure-Python modules trainctl needs (tomlkit), last on sys.path:
used only when the user's interpreter has none of its own.
"""

import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
_MAIN_PID = os.getpid()
_ENV = "TRAINCTL_INSTRUMENT"
_EVENTS = "TRAINCTL_EVENTS_PATH"
_PACKAGE = "trainctl.inside"
try:
    import trainctl_flight as _flight_mod  # type: ignore[import-not-found]  # next to this file, on sys.path here
except Exception:  # noqa: BLE001 - the rest of the bootstrap goes on without it
    _flight_mod = None
_MIN_PYTHON = (3, 8)  # what trainctl.inside and what it imports run on (tests/e2e/test_old_pythons.py)


def say(text, key):
    """An info event on the side channel (nothing when there is none)."""
    path = os.environ.get(_EVENTS, "")
    if not path:
        return
    try:
        import json
        import time

        line = (
            json.dumps({"ts": time.time(), "type": "info", "text": text, "key": key}, ensure_ascii=False)
            + "\n"
        )
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC | os.O_NOFOLLOW)
        try:
            os.write(fd, line.encode())
        finally:
            os.close(fd)
    except Exception:  # noqa: BLE001 - a report must never break the script
        pass


def _unlist(keep_env=False):
    """Our directory off sys.path and off the front of PYTHONPATH (the user's stays);
    ``keep_env``: on sys.path only (a torchrun launcher: its ranks load the bootstrap)."""
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]
    if keep_env:
        return
    parts = os.environ.get("PYTHONPATH", "").split(os.pathsep)
    if parts and parts[0] and os.path.abspath(parts[0]) == _HERE:
        rest = os.pathsep.join(parts[1:])
        if rest:
            os.environ["PYTHONPATH"] = rest
        else:
            del os.environ["PYTHONPATH"]


class _Loader:
    """The watched module's own loader; after it ran the module, trainctl attaches."""

    def __init__(self, loader, hook, name):
        self._loader = loader
        self._hook = hook
        self._name = name

    def __getattr__(self, attr):
        return getattr(self._loader, attr)

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        module.__loader__ = self._loader  # the module sees its own loader
        if module.__spec__ is not None:
            module.__spec__.loader = self._loader
        self._loader.exec_module(module)
        self._hook.attach(self._name, module)


class ImportHook:
    """Watches top-level imports of the libraries trainctl integrates with."""

    def __init__(self, settings):
        self.watch = dict(settings.get("watch") or {})
        self.path = settings.get("path")
        self.fallback = settings.get("fallback")
        self.busy = set()
        self.paths_ready = False

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in self.watch or fullname in self.busy or path is not None:
            return None
        self.busy.add(fullname)
        try:
            from importlib.util import find_spec

            spec = find_spec(fullname)
        except Exception:  # noqa: BLE001 - the import itself then fails as it would have
            return None
        finally:
            self.busy.discard(fullname)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return None
        spec.loader = _Loader(spec.loader, self, fullname)
        return spec

    def attach(self, name, module):
        integration = self.watch.pop(name, None)
        if integration is None or os.getpid() != _MAIN_PID:
            return
        try:
            if sys.version_info < _MIN_PYTHON:
                raise ImportError(
                    f"it needs Python {'.'.join(map(str, _MIN_PYTHON))} or newer, "
                    f"this is {sys.version.split()[0]}"
                )
            self.make_importable()
            from importlib import import_module

            package = import_module(_PACKAGE)
            code = import_module(f"{_PACKAGE}.{integration}")
        except Exception as e:  # noqa: BLE001
            say(
                f"{integration} integration not attached: trainctl's code cannot be imported by "
                f"{sys.executable} ({type(e).__name__}: {e}); the script runs unaltered, console "
                "parsing",
                "instrument.failed",
            )
            return
        try:
            description = code.attach(module)
        except package.Refused as e:
            say(f"{integration} integration not attached: {e}; console parsing", package.REFUSED_KEY)
            return
        except Exception as e:  # noqa: BLE001
            say(
                f"{integration} integration failed to attach ({type(e).__name__}: {e}); the "
                "script runs unaltered, console parsing",
                package.FAILED_KEY,
            )
            return
        package.attached.add(integration)
        key = getattr(code, "ATTACHED_AS", f"{package.ATTACHED_KEY}.{integration}")
        say(f"integration attached: {description}", key)

    def make_importable(self):
        """trainctl's directory first (it holds ``trainctl`` alone: the agent's version wins
        and nothing else is shadowed), its fallbacks last; on sys.path, so that spawned
        workers (multiprocessing passes sys.path on) can unpickle trainctl's objects."""
        if self.paths_ready:
            return
        self.paths_ready = True
        if self.path and self.path not in sys.path:
            sys.path.insert(0, self.path)
        if self.fallback and self.fallback not in sys.path:
            sys.path.append(self.fallback)


def _chain():
    """The sitecustomize the user's path would have given, run as ``sitecustomize``."""
    from importlib.machinery import PathFinder

    spec = PathFinder.find_spec("sitecustomize", sys.path)
    if spec is None or spec.loader is None or spec.origin == __file__:
        return
    from importlib.util import module_from_spec

    module = module_from_spec(spec)
    sys.modules["sitecustomize"] = module
    spec.loader.exec_module(module)  # its errors are site's to print, as without trainctl


def _flight():
    """A torchrun rank: its Flight Recorder answered (``trainctl_flight``); the launcher:
    the bootstrap kept on PYTHONPATH for its ranks.  Whether PYTHONPATH keeps it."""
    directory = os.environ.get(_flight_mod.DIR_ENV) if _flight_mod is not None else None
    if not directory:
        return False
    if not _flight_mod.is_rank(os.environ):
        return True
    del os.environ[_flight_mod.DIR_ENV]
    try:
        _flight_mod.start(directory, int(os.environ["RANK"]))
    except Exception as e:  # noqa: BLE001
        say(f"the rank's Flight Recorder cannot be asked for ({type(e).__name__}: {e})", "flight.failed")
    return False


def _main():
    _unlist(keep_env=_flight())
    raw = os.environ.pop(_ENV, None)
    if raw is None:
        return
    try:
        import json

        settings = json.loads(raw)
        if not isinstance(settings, dict):
            raise ValueError("not a JSON object")
        sys.meta_path.insert(0, ImportHook(settings))
    except Exception as e:  # noqa: BLE001
        say(
            f"trainctl bootstrap failed ({type(e).__name__}: {e}); the script runs unaltered, "
            "console parsing",
            "instrument.failed",
        )


try:
    _main()
except Exception as _e:  # noqa: BLE001 - never break the interpreter's start-up
    say(
        f"trainctl bootstrap failed ({type(_e).__name__}: {_e}); the script runs unaltered, console parsing",
        "instrument.failed",
    )
_chain()
