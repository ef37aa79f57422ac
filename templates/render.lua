-- render.lua: flashjit's template renderer.
--
-- A template is text with three kinds of tags:
--   {{ expr }}   the value of a Lua expression
--   {% code %}   Lua statements (for/if/local ... end)
--   {# note #}   a comment, dropped
-- A line that holds nothing but a {% %} or {# #} tag (and blanks) vanishes
-- whole, so control flow does not leave empty lines in the output.
-- "{{", "{%" and "{#" always open a tag: CUDA text that needs the characters
-- puts a blank between them, as in inline PTX "{ %0, %1 }".
--
-- A template compiles to a Lua function whose line numbers are those of the
-- template, so an error reads "attention.cu:57: ...".  It runs in a sandbox:
-- an environment built from an allow-list (no io, os, require, load, debug,
-- dofile, print, getmetatable), loaded as text only; Lua helpers come in
-- through import(), sandboxed the same way.  The C side adds an
-- instruction-count limit and a memory cap.
--
-- This chunk receives the C function `source(name) -> text | nil, why` and
-- returns the renderer: { render = function(name, params) -> text, meta }.

local source = ...

local concat, insert = table.concat, table.insert
-- The string functions are the bounded ones the C side put in the string
-- table before this chunk ran (templates get the same): a pattern is
-- charged by the positions it scans, so the renderer's patterns are all
-- linear -- single characters and classes, no repetition -- and scan a
-- text once.
local find, sub, gsub, rep, byte, format =
  string.find, string.sub, string.gsub, string.rep, string.byte,
  string.format
local mtype, floor = math.type, math.floor

-- Quote s as a Lua string literal on one line, so that the generated code
-- keeps the template's line structure.
local function quote(s)
  return '"' .. gsub(s, '[%c"\\]', function(c)
    if c == "\n" then return "\\n" end
    if c == "\t" then return "\\t" end
    if c == '"' then return '\\"' end
    if c == "\\" then return "\\\\" end
    return format("\\%03d", byte(c))
  end) .. '"'
end

local function count_lines(s)
  local _, n = gsub(s, "\n", "")
  return n
end

-- The blanks that end s after its last newline (or all of s, when it is
-- blank and starts a line): the indentation of a tag alone on its line;
-- nil when s ends in anything else.
local function line_lead(s, at_line_start)
  local i = #s
  while i > 0 and (byte(s, i) == 32 or byte(s, i) == 9) do i = i - 1 end
  if i == 0 then return at_line_start and s or nil end
  if byte(s, i) == 10 then return sub(s, i + 1) end
  return nil
end

-- The blanks and newline that follow a tag at position at, when nothing
-- else does before the line's end; else nil.
local function line_tail(text, at)
  local e = find(text, "[^ \t]", at)
  if e and byte(text, e) == 10 then return sub(text, at, e) end
  return nil
end

-- Split text into {kind, body} pieces: "text", "expr", "code".
local function scan(name, text)
  local pieces, pos, line = {}, 1, 1
  while true do
    local s, e, open = find(text, "{([{%%#])", pos)
    if not s then
      insert(pieces, { "text", sub(text, pos) })
      return pieces
    end
    local close = ({ ["{"] = "}}", ["%"] = "%}", ["#"] = "#}" })[open]
    local cs, ce = find(text, close, e + 1, true)
    if not cs then
      line = line + count_lines(sub(text, pos, s))
      error(format("%s:%d: unclosed '{%s' tag", name, line, open), 0)
    end
    local before, body = sub(text, pos, s - 1), sub(text, e + 1, cs - 1)
    local after = ce + 1
    if open ~= "{" then
      -- A tag alone on its line takes its indentation and newline with it.
      local at_line_start = pos == 1 or sub(text, pos - 1, pos - 1) == "\n"
      local lead = line_lead(before, at_line_start)
      local tail = line_tail(text, after)
      if lead and tail then
        before = sub(before, 1, #before - #lead)
        after = after + #tail
        body = body .. "\n"  -- keep the line count of the generated code
      end
    end
    insert(pieces, { "text", before })
    insert(pieces, { open == "{" and "expr" or (open == "%" and "code" or "note"), body })
    line = line + count_lines(sub(text, pos, after - 1))
    pos = after
  end
end

-- s without its leading and trailing blanks, in time linear in s (the
-- pattern "^%s*(.-)%s*$" is quadratic in a run of blanks).
local function trim(s)
  local first = find(s, "%S")
  if not first then return "" end
  local last = #s
  while find(s, "^%s", last) do last = last - 1 end
  return sub(s, first, last)
end

-- Generate the Lua source of a template: `return function(_ENV) ... end`.
local function generate(name, text)
  local out = { "return function(_ENV) local _o, _v = {}, __value " }
  for _, p in ipairs(scan(name, text)) do
    local kind, body = p[1], p[2]
    if kind == "text" and #body > 0 then
      out[#out + 1] = "_o[#_o+1]=" .. quote(body) .. rep("\n", count_lines(body)) .. " "
    elseif kind == "expr" then
      out[#out + 1] = "_o[#_o+1]=_v(" .. body .. ", " .. quote(trim(body)) .. ") "
    elseif kind == "code" then
      out[#out + 1] = body .. " "
    elseif kind == "note" then
      out[#out + 1] = rep("\n", count_lines(body))
    end
  end
  out[#out + 1] = " return table.concat(_o) end"
  return concat(out)
end

-- How an expression's value becomes text.  Floats keep 9 significant digits
-- (enough for a float32), integers print as integers; nil is an error so that
-- a misspelt parameter is caught, not rendered as "nil".
local function value(v, expr)
  local t = type(v)
  if t == "string" then return v end
  if t == "number" then
    if mtype(v) == "integer" then return tostring(v) end
    if v == floor(v) and v > -1e15 and v < 1e15 then return format("%.1f", v) end
    return format("%.9g", v)
  end
  if t == "boolean" then return v and "true" or "false" end
  error(format("{{ %s }} is %s", expr, t), 2)
end

local compiled = {}

local function compile(name)
  local fn = compiled[name]
  if fn then return fn end
  local text, why = source(name)
  if not text then error(format("template '%s' not found: %s", name, why), 0) end
  local chunk, err = load(generate(name, text), "=" .. name, "t", {})
  if not chunk then error(err, 0) end
  fn = chunk()
  compiled[name] = fn
  return fn
end

local function copy(t)
  local c = {}
  for k, v in pairs(t) do c[k] = v end
  return c
end

-- Sorted keys, for templates that must iterate a table into the output
-- (pairs order is not stable, and the output must be).
local function sorted_keys(t)
  local keys = {}
  for k in pairs(t) do keys[#keys + 1] = k end
  table.sort(keys, function(a, b) return tostring(a) < tostring(b) end)
  return keys
end

local refusal = {}

local function sandbox(params, meta)
  local env = {
    math = copy(math), string = copy(string), table = copy(table),
    utf8 = copy(utf8),
    ipairs = ipairs, pairs = pairs, next = next, select = select,
    tostring = tostring, tonumber = tonumber, type = type, error = error,
    assert = assert, rawequal = rawequal, rawlen = rawlen,
    unpack = table.unpack, sorted_keys = sorted_keys,
    __value = value, meta = meta, P = params,
  }
  env.string.dump = nil
  -- refuse("why") ends rendering with a clean "unsupported" error (no
  -- traceback): the template says what it cannot generate and why.
  env.refuse = function(why) error(setmetatable({ why = why }, refusal), 0) end
  -- import(name) runs a Lua helper file of templates/ (text only) in this
  -- sandbox and returns what it returns.
  env.import = function(name)
    local text, why = source(name)
    if not text then error(format("module '%s' not found: %s", name, why), 2) end
    local chunk, err = load(text, "=" .. name, "t", env)
    if not chunk then error(err, 0) end
    return chunk()
  end
  -- include(name [, extra]) renders another template in a sandbox of its own
  -- that sees the same parameters (plus extra) and the same meta table.
  env.include = function(name, extra)
    local p = copy(params)
    for k, v in pairs(extra or {}) do p[k] = v end
    return compile(name)(setmetatable({}, { __index = function(_, k)
      local v = p[k]
      if v ~= nil then return v end
      return env[k]
    end }))
  end
  for k, v in pairs(params) do env[k] = v end
  return env
end

local R = {}

-- render(name, params) -> text, meta.  Errors propagate as Lua errors: a
-- table with field `why` for a refusal, a string otherwise.
function R.render(name, params)
  local meta = {}
  local text = compile(name)(sandbox(params, meta))
  return text, meta
end

function R.is_refusal(e)
  return getmetatable(e) == refusal
end

-- For tests of the renderer itself: render a template given as text.
function R.render_text(name, text, params)
  local chunk, err = load(generate(name, text), "=" .. name, "t", {})
  if not chunk then error(err, 0) end
  local meta = {}
  return chunk()(sandbox(params, meta)), meta
end

return R
