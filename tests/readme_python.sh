#!/bin/sh
# readme_python.sh README PYTHON -- README's Python block for machines with
# no GPU (the one after "Without a GPU"), run as pasted: extracted whole,
# nothing added (FLASHJIT_LIB and PYTHONPATH come from ctest).
readme=$1
py=$2
block=$(awk '/Without a GPU \(and without PyTorch\)/ { seen = 1 }
             seen && /^```python$/ { inside = 1; next }
             inside && /^```$/ { exit }
             inside { print }' "$readme")
if [ -z "$block" ]; then
  echo "readme_python: no block after 'Without a GPU' in $readme"
  exit 1
fi
printf '%s\n' "$block" | "$py" -
