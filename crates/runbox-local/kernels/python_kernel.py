# runbox's Python kernel driver: one persistent interpreter per sandbox, notebook semantics.
#
# Started by runbox inside the sandbox with fd 0 = /dev/null, fd 1 and fd 2 = pipes read by
# runbox, fd 3 = the control socket. Protocol (see runbox-local/src/kernel/mod.rs):
#
#   runbox -> kernel   b"run <marker> <code bytes> <env bytes>\n" + code + env
#                      (env: KEY=VALUE entries separated by NUL, applied for this run only)
#   kernel -> runbox   one JSON object per line: {"type":"ready",...} once, then per run
#                      {"type":"display",...} for each display() and a final {"type":"done",...}
#
# After each run the kernel writes <marker> to fd 1 and fd 2, after everything the run
# printed, so runbox knows where the run's output ends. Control messages never travel on
# fd 1 or fd 2: nothing user code prints can forge them.
#
# Imports are kept to C modules and what `site` already loaded: start-up time is the
# first-result latency of every fresh sandbox.

import builtins
import os
import sys
import _json
import _signal

_CTRL = 3
_PYCF_ONLY_AST = 0x400
_PYCF_ALLOW_TOP_LEVEL_AWAIT = 0x2000
_CO_COROUTINE = 0x80
_THIS_FILE = __file__
_encode_str = _json.encode_basestring_ascii

_executing = [False]
_sources = {}
_loop = [None]
_main = type(sys)("__main__")
_main.__dict__["__builtins__"] = builtins
sys.modules["__main__"] = _main
sys.argv = [""]
_saved_stdio = (os.dup(1), os.dup(2))


def _on_sigint(signum, frame):
    # Interrupts (timeouts, cancellation) reach the user's code only while it runs.
    if _executing[0]:
        raise KeyboardInterrupt


_signal.signal(_signal.SIGINT, _on_sigint)


def _to_json(value):
    """Encodes plain data (None, bool, int, float, str, list, dict) as JSON text."""
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, str):
        return _encode_str(value)
    if isinstance(value, (int, float)):
        r = repr(value)
        return r if r not in ("nan", "inf", "-inf") else "null"
    if isinstance(value, dict):
        return "{" + ",".join(_encode_str(str(k)) + ":" + _to_json(v) for k, v in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(_to_json(v) for v in value) + "]"
    return _encode_str(repr(value))


def _send(obj):
    data = (_to_json(obj) + "\n").encode("utf-8", "surrogateescape")
    view = memoryview(data)
    while view:
        n = os.write(_CTRL, view)
        view = view[n:]


def _write_all(fd, data):
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


# Rich output, as a notebook shows it: each result is a bundle of representations keyed by
# MIME type. Images travel as base64; anything over _MAX_REPR is left out with a note.
_MAX_REPR = 8 << 20
_REPR_METHODS = (
    ("image/png", "_repr_png_"),
    ("image/jpeg", "_repr_jpeg_"),
    ("image/svg+xml", "_repr_svg_"),
    ("text/html", "_repr_html_"),
    ("text/markdown", "_repr_markdown_"),
    ("text/latex", "_repr_latex_"),
    ("application/json", "_repr_json_"),
)


def _b64(data):
    import base64

    return base64.b64encode(data).decode("ascii")


def _figure_png(fig):
    import io

    buf = io.BytesIO()
    fig.savefig(buf, format="png", bbox_inches="tight")
    return buf.getvalue()


def _is_figure(obj):
    mpl = sys.modules.get("matplotlib.figure")
    return mpl is not None and isinstance(obj, mpl.Figure)


def _bundle(obj):
    """The MIME bundle of `obj`: its _repr_*_ methods, a figure's PNG, and always text/plain."""
    data = {}
    if _is_figure(obj):
        data["image/png"] = _figure_png(obj)
    elif not isinstance(obj, type):
        mimebundle = getattr(obj, "_repr_mimebundle_", None)
        if callable(mimebundle):
            try:
                got = mimebundle(include=None, exclude=None)
                if isinstance(got, tuple):
                    got = got[0]
                if isinstance(got, dict):
                    data.update(got)
            except Exception:
                pass
        for mime, name in _REPR_METHODS:
            method = getattr(obj, name, None)
            if mime in data or not callable(method):
                continue
            try:
                value = method()
            except Exception:
                continue
            if isinstance(value, tuple):
                value = value[0]
            if value is not None:
                data[mime] = value
    for mime in ("image/png", "image/jpeg"):
        if isinstance(data.get(mime), (bytes, bytearray)):
            data[mime] = _b64(bytes(data[mime]))
    for mime, value in list(data.items()):
        if isinstance(value, (bytes, bytearray)):
            data[mime] = bytes(value).decode("utf-8", "replace")
        if isinstance(data[mime], str) and len(data[mime]) > _MAX_REPR:
            data[mime] = "<%s left out: %d bytes is over the limit>" % (mime, len(data[mime]))
    if "text/plain" not in data:
        try:
            data["text/plain"] = repr(obj)
        except Exception as e:
            data["text/plain"] = "<unprintable %s: %s>" % (type(obj).__name__, e)
    return data


def display(*objs, **_ignored):
    """Shows each object in the run's results, as a notebook's display() does."""
    for obj in objs:
        _flush_streams()
        _send({"type": "display", "data": _bundle(obj)})


builtins.display = display


def _show_figures(*_args, **_kwargs):
    """Sends every open matplotlib figure as an image and closes it (plt.show, or the end of
    a cell that left figures open)."""
    plt = sys.modules.get("matplotlib.pyplot")
    if plt is None:
        return
    for number in plt.get_fignums():
        display(plt.figure(number))
    plt.close("all")


def _hook_pyplot():
    plt = sys.modules.get("matplotlib.pyplot")
    if plt is not None and plt.show is not _show_figures:
        plt.show = _show_figures


def _run_coroutine(coro):
    import asyncio

    if _loop[0] is None or _loop[0].is_closed():
        _loop[0] = asyncio.new_event_loop()
    return _loop[0].run_until_complete(coro)


def _evaluate(code_obj, namespace):
    value = eval(code_obj, namespace)
    if code_obj.co_flags & _CO_COROUTINE:
        value = _run_coroutine(value)
    return value


def _format_error(exc):
    import linecache
    import traceback

    for name, src in _sources.items():
        linecache.cache[name] = (len(src), None, src.splitlines(True), name)
    # Show the user's frames only: skip the driver's (and asyncio's) frames up to the first
    # frame of a cell.
    tb = exc.__traceback__
    first_cell = tb
    while first_cell is not None and not first_cell.tb_frame.f_code.co_filename.startswith("<cell "):
        first_cell = first_cell.tb_next
    if first_cell is not None:
        tb = first_cell
    else:
        while tb is not None and tb.tb_frame.f_code.co_filename == _THIS_FILE:
            tb = tb.tb_next
    try:
        summary = traceback.TracebackException(type(exc), exc, tb, compact=True)
    except TypeError:  # Python before 3.10
        summary = traceback.TracebackException(type(exc), exc, tb)
    # The driver's own frames (its SIGINT handler, which raises KeyboardInterrupt) are noise.
    summary.stack = traceback.StackSummary.from_list(
        [f for f in summary.stack if f.filename != _THIS_FILE]
    )
    text = "".join(summary.format())
    try:
        value = str(exc)
    except Exception:
        value = "<unprintable %s>" % type(exc).__name__
    return {"name": type(exc).__name__, "value": value, "traceback": text}


def _apply_env(pairs):
    saved = {}
    for pair in pairs:
        key, _, value = pair.partition("=")
        if key:
            saved.setdefault(key, os.environ.get(key))
            os.environ[key] = value
    return saved


def _restore_env(saved):
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


def _flush_streams():
    for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        try:
            stream.flush()
        except Exception:
            pass


def _flush():
    _flush_streams()
    # Undo any redirection of fd 1 and 2 the code made, so the marker reaches runbox.
    os.dup2(_saved_stdio[0], 1)
    os.dup2(_saved_stdio[1], 2)


def _run(cell, code, env_pairs):
    from _ast import Expr, Expression

    name = "<cell %d>" % cell
    _sources[name] = code
    result = None
    error = None
    namespace = _main.__dict__
    saved_env = _apply_env(env_pairs)
    try:
        _executing[0] = True
        tree = compile(code, name, "exec", _PYCF_ONLY_AST | _PYCF_ALLOW_TOP_LEVEL_AWAIT, dont_inherit=True)
        last = None
        if tree.body and isinstance(tree.body[-1], Expr):
            last = Expression(tree.body.pop().value)
        flags = _PYCF_ALLOW_TOP_LEVEL_AWAIT
        _evaluate(compile(tree, name, "exec", flags, dont_inherit=True), namespace)
        if last is not None:
            value = _evaluate(compile(last, name, "eval", flags, dont_inherit=True), namespace)
            if value is not None:
                builtins._ = value
                result = value
    except SystemExit as exc:
        _executing[0] = False
        if exc.code not in (None, 0):
            error = {"name": "SystemExit", "value": str(exc.code), "traceback": ""}
    except BaseException as exc:  # KeyboardInterrupt too: it is how a timeout ends a cell
        _executing[0] = False
        error = _format_error(exc)
    finally:
        _executing[0] = False
        _restore_env(saved_env)
    return result, error


def _finish_cell(result, error):
    """After a cell: figures left open are shown, the last value becomes a bundle."""
    bundle = None
    try:
        _hook_pyplot()
        _show_figures()
        if result is not None:
            bundle = _bundle(result)
    except BaseException as exc:  # a broken _repr_ or figure must not lose the run
        if error is None:
            error = _format_error(exc)
    return bundle, error


def _main_loop():
    requests = open(_CTRL, "rb", buffering=65536, closefd=False)
    _send({"type": "ready", "version": sys.version.split()[0], "pid": os.getpid()})
    cell = 0
    while True:
        header = requests.readline()
        if not header:
            return
        parts = header.split()
        if len(parts) != 4 or parts[0] != b"run":
            _send({"type": "fatal", "message": "malformed request"})
            return
        marker = parts[1]
        code = requests.read(int(parts[2])).decode("utf-8", "surrogateescape")
        env = requests.read(int(parts[3])).decode("utf-8", "surrogateescape")
        cell += 1
        result, error = _run(cell, code, [p for p in env.split("\0") if p])
        result, error = _finish_cell(result, error)
        _flush()
        markers = True
        try:
            _write_all(1, marker)
            _write_all(2, marker)
        except OSError:
            markers = False
        _send({"type": "done", "result": result, "error": error, "markers": markers})


_main_loop()
