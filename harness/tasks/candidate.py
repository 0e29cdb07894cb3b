"""The jailed side of the sandbox: the only code that runs next to a model-written program.

It is sent as text to the jail's interpreter (`python3 -I -c`), reads the program from its
protocol pipe, runs it, reports the names of the functions it defined, and then answers calls
(`name(*args)`) with the return value as plain data: exact built-in types only (None, bool,
int, float, str, bytes, list, tuple, set, frozenset, dict), so no object with a lying `__eq__`
ever leaves the jail. The program can tamper with this code (it shares the interpreter), but all
it can then send is data, which the trusted side decodes into plain values and compares itself.
The program's own prints go to stderr; the protocol uses a duplicate of the original stdout.
"""

SOURCE = r'''
import json, os, sys
_out = os.fdopen(os.dup(1), "w", buffering=1)
_in = os.fdopen(os.dup(0), "r")
os.dup2(2, 1)
_null = os.open(os.devnull, os.O_RDONLY)
os.dup2(_null, 0)
del _null

def _enc(x, depth=0):
    if depth > 50:
        raise ValueError("value nested too deeply")
    t = type(x)
    if x is None:
        return ["none"]
    if t is bool or t is int or t is str:
        return [t.__name__, x]
    if t is float:
        return ["float", repr(x)]
    if t is bytes:
        return ["bytes", x.hex()]
    if t in (list, tuple, set, frozenset):
        return [t.__name__, [_enc(i, depth + 1) for i in x]]
    if t is dict:
        return ["dict", [[_enc(k, depth + 1), _enc(v, depth + 1)] for k, v in x.items()]]
    raise TypeError(f"returned a {t.__name__}: only plain built-in values are accepted")

def _dec(v):
    tag = v[0]
    if tag == "none":
        return None
    if tag in ("bool", "int", "str"):
        return v[1]
    if tag == "float":
        return float(v[1])
    if tag == "bytes":
        return bytes.fromhex(v[1])
    if tag in ("list", "tuple", "set", "frozenset"):
        return {"list": list, "tuple": tuple, "set": set, "frozenset": frozenset}[tag](_dec(i) for i in v[1])
    if tag == "dict":
        return {_dec(k): _dec(x) for k, x in v[1]}
    raise ValueError(tag)

def _send(message):
    _out.write(json.dumps(message) + "\n")
    _out.flush()

def _serve():
    job = json.loads(_in.readline())
    namespace = {"__name__": "__candidate__", "__builtins__": __builtins__}
    try:
        exec(compile(job["program"], "program.py", "exec"), namespace)
    except BaseException as exc:
        _send({"ready": False, "error": f"{type(exc).__name__}: {str(exc)[:300]}"})
        return
    names = sorted(n for n, v in namespace.items() if not n.startswith("__") and callable(v))
    _send({"ready": True, "functions": names})
    for line in _in:
        request = json.loads(line)
        try:
            value = namespace[request["name"]](*[_dec(a) for a in request["args"]],
                                               **{k: _dec(a) for k, a in request["kwargs"].items()})
            _send({"ok": True, "value": _enc(value)})
        except BaseException as exc:
            _send({"ok": False, "error": f"{type(exc).__name__}: {str(exc)[:300]}"})

_serve()
'''
