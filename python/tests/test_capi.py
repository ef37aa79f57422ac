"""The ctypes mirror against the C header: every struct's size and every
field's offset, as a C compiler sees them; every status code and
enumeration value; every FJ_API function declared."""
import ctypes as C
import os
import re
import shutil
import subprocess
import tempfile
import unittest

import fjtest
from flashjit import _capi as capi

CC = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
HAVE_HEADER = os.path.isfile(fjtest.HEADER)


def _c_program():
    lines = ["#include <stddef.h>", "#include <stdio.h>", '#include "flashjit.h"',
             "int main(void) {"]
    for cls, cname in capi.C_NAMES.items():
        lines.append(f'  printf("{cname} sizeof %zu\\n", sizeof({cname}));')
        for field, _ in cls._fields_:
            cfield = capi.C_FIELD_NAMES.get((cls, field), field)
            lines.append(f'  printf("{cname} {field} %zu\\n", offsetof({cname}, {cfield}));')
    for name in dir(capi):
        if re.fullmatch(r"(OK|ERR_[A-Z_]+)", name):
            lines.append(f'  printf("status {name} %d\\n", (int)FJ_{name});')
    for name in ("F16", "BF16", "E4M3", "F32", "MMA_WMMA", "MMA_SYNC", "MMA_WGMMA",
                 "SOFTMAX_SMEM", "SOFTMAX_REGS", "SWIZZLE_NONE", "SWIZZLE_PAD", "SWIZZLE_XOR",
                 "CAUSAL_NONE", "CAUSAL_TOP_LEFT", "CAUSAL_BOTTOM_RIGHT", "CACHE_MISS",
                 "CACHE_MEMORY", "CACHE_DISK", "BHSD", "BSHD", "THD", "CHOICE_HEURISTIC",
                 "CHOICE_TUNED", "MOD_F32", "MOD_I32", "MOD_F16", "MOD_BF16", "LUT_PROBED",
                 "LUT_CACHED", "LUT_REFERENCE", "PAGE_SIZE_MAX", "MOD_PARAMS_MAX",
                 "MOD_EXPR_MAX", "MOD_NAME_MAX", "WINDOW_MAX", "SPLITS_MAX", "FRAG_COUNT",
                 "LUT_MAX_SLOTS", "ABI_VERSION", "HEAD_DIM_MAX", "HEAD_DIM_V_MAX"):
        lines.append(f'  printf("value {name} %lld\\n", (long long)FJ_{name});')
    lines += ["  return 0;", "}"]
    return "\n".join(lines) + "\n"


@unittest.skipUnless(CC and HAVE_HEADER, "needs a C compiler and include/flashjit.h "
                     "(a source checkout)")
class HeaderLayout(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        with tempfile.TemporaryDirectory() as d:
            src, exe = os.path.join(d, "layout.c"), os.path.join(d, "layout")
            with open(src, "w") as f:
                f.write(_c_program())
            subprocess.run([CC, "-std=c11", "-I", os.path.dirname(fjtest.HEADER), src, "-o",
                            exe], check=True, capture_output=True)
            out = subprocess.run([exe], check=True, capture_output=True, text=True).stdout
        cls.facts = {}
        for line in out.splitlines():
            a, b, n = line.split()
            cls.facts[(a, b)] = int(n)

    def test_struct_sizes_and_offsets(self):
        for cls, cname in capi.C_NAMES.items():
            with self.subTest(struct=cname):
                self.assertEqual(C.sizeof(cls), self.facts[(cname, "sizeof")],
                                 f"sizeof({cname}): the header changed; update _capi.py")
                for field, _ in cls._fields_:
                    self.assertEqual(getattr(cls, field).offset, self.facts[(cname, field)],
                                     f"{cname}.{field}")

    def test_status_codes(self):
        for (kind, name), value in self.facts.items():
            if kind == "status":
                self.assertEqual(getattr(capi, name), value, name)

    def test_enum_values(self):
        for (kind, name), value in self.facts.items():
            if kind == "value":
                self.assertEqual(getattr(capi, name), value, name)


@unittest.skipUnless(HAVE_HEADER, "needs include/flashjit.h (a source checkout)")
class HeaderFunctions(unittest.TestCase):
    def test_every_function_declared(self):
        with open(fjtest.HEADER) as f:
            names = set(re.findall(r"^FJ_API\b[^(]*?\b(fj_\w+)\s*\(", f.read(), re.M))
        self.assertTrue(names)
        self.assertEqual(sorted(names - set(capi.SIGNATURES)), [],
                         "functions in flashjit.h that _capi.SIGNATURES lacks")
        self.assertEqual(sorted(set(capi.SIGNATURES) - names), [],
                         "functions in _capi.SIGNATURES that flashjit.h lacks")

    def test_status_list_complete(self):
        with open(fjtest.HEADER) as f:
            codes = re.findall(r"X\((\w+), (\d+),", f.read())
        for name, value in codes:
            self.assertEqual(getattr(capi, name, None), int(value), f"FJ_{name}")


if __name__ == "__main__":
    unittest.main()
