// Small templates with hand-derived expected output, shared by the unit test (perry's renderer) and
// the oracle test (which checks that the expectations themselves match @huggingface/jinja).
#pragma once
#include <string>
#include <vector>

struct JinjaCase {
  const char* name;
  const char* tmpl;
  const char* context;  // JSON object
  const char* expected;
};

inline const std::vector<JinjaCase>& jinja_cases() {
  static const std::vector<JinjaCase> cases = {
      {"text", "hello\n", "{}", "hello"},
      {"text_two_newlines", "hello\n\n", "{}", "hello\n"},
      {"var", "{{ x }}-{{ y }}", R"({"x": "a", "y": 3})", "a-3"},
      {"undefined_prints_nothing", "[{{ nothing }}][{{ none }}]", "{}", "[][]"},
      {"comment", "a{# note #}b{#- strip -#}  c", "{}", "abc"},
      {"ws_control", "a  {%- if true -%}  b  {%- endif -%}  c", "{}", "abc"},
      {"ws_expr", "a \n {{- 'x' -}} \n b", "{}", "axb"},
      {"trim_lstrip_blocks", "  {% if true %}\nX\n  {% endif %}\nY", "{}", "X\nY"},
      {"if_elif_else", "{% for v in [1, 2, 3] %}{% if v == 1 %}one{% elif v == 2 %}two{% else %}many{% endif %};{% endfor %}",
       "{}", "one;two;many;"},
      {"loop_vars",
       "{% for x in xs %}{{ loop.index }}{{ loop.index0 }}{{ loop.first }}"
       "{{ loop.last }}{{ loop.length }}{{ loop.revindex }},{% endfor %}",
       R"({"xs": ["p", "q"]})", "10truefalse22,21falsetrue21,"},
      {"for_else", "{% for x in [] %}x{% else %}empty{% endfor %}", "{}", "empty"},
      {"for_if", "{% for x in [1, 2, 3, 4] if x is even %}{{ x }}{{ loop.index }} {% endfor %}", "{}", "21 42 "},
      {"for_items_unpack", "{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}{% for k in d %}{{ k }}{% endfor %}",
       R"({"d": {"b": 1, "a": "x"}})", "b=1;a=x;ba"},
      {"for_items_filter", "{% for k, v in d | items %}{{ k }}{{ v }}{% endfor %}", R"({"d": {"z": 1, "y": 2}})", "z1y2"},
      {"break_continue", "{% for x in [1, 2, 3, 4] %}{% if x == 2 %}{% continue %}{% endif %}{% if x == 4 %}{% break %}{% endif %}{{ x }}{% endfor %}",
       "{}", "13"},
      {"set_scope", "{% set x = 1 %}{% for i in [1] %}{% set x = 2 %}{% endfor %}{{ x }}", "{}", "1"},
      {"namespace", "{% set ns = namespace(n=0, s='') %}{% for i in [1, 2, 3] %}{% set ns.n = ns.n + i %}{% endfor %}{{ ns.n }}",
       "{}", "6"},
      {"set_block", "{% set b %}x{{ 1 + 1 }}{% endset %}[{{ b }}]", "{}", "[x2]"},
      {"set_tuple", "{% set a, b = [1, 'z'] %}{{ b }}{{ a }}", "{}", "z1"},
      {"macro", "{% macro greet(name, punct='!') %}hi {{ name }}{{ punct }}{% endmacro %}{{ greet('bo') }} {{ greet('al', punct='?') }}",
       "{}", "hi bo! hi al?"},
      {"call_block", "{% macro wrap(t) %}<{{ t }}>{{ caller() }}</{{ t }}>{% endmacro %}{% call wrap('b') %}in{% endcall %}", "{}",
       "<b>in</b>"},
      {"string_escapes", R"({{ 'a\nb' }}|{{ "q\"q" }}|{{ 'it\'s' }}|{{ '\u00e9\x41' }}|{{ 'ab' 'cd' }})", "{}",
       "a\nb|q\"q|it's|\xC3\xA9" "A|abcd"},
      {"arith", "{{ 7 // 2 }} {{ 7 / 2 }} {{ 2 ** 10 }} {{ -7 % 3 }} {{ 1.0 }} {{ 0.1 + 0.2 }} {{ 10 ** 21 }} {{ 3 - 5 }} {{ 2 * 2.5 }}",
       "{}", "3 3.5 1024 -1 1.0 0.30000000000000004 1e+21 -2 5.0"},
      {"literals", "{{ [1, 'a', none, true, 2.5] }} {{ {'k': [1, {'n': false}]} }} {{ true }}", "{}",
       "[1, \"a\", null, true, 2.5] {\"k\": [1, {\"n\": false}]} true"},
      {"slicing", "{{ xs[::-1] }} {{ xs[1:] }} {{ xs[:-1] }} {{ xs[-1] }} {{ 'h\xC3\xA9llo'[1:3] }} {{ 'abc'[::-1] }}",
       R"({"xs": [1, 2, 3]})", "[3, 2, 1] [2, 3] [1, 2] 3 \xC3\xA9l cba"},
      {"logic", "{{ 0 or 'x' }} {{ 'a' and 'b' }} {{ not 0 }} {{ 1 in [1, 2] }} {{ 'b' not in 'abc' }} {{ 'k' in d }} {{ 2 <= 2 }}",
       R"({"d": {"k": 1}})", "x b true true false true true"},
      {"tests",
       "{{ x is defined }}{{ y is defined }}{{ n is none }}{{ s is string }}{{ d is mapping }}{{ l is iterable }}{{ s is iterable }}"
       "{{ d is iterable }}{{ 3 is odd }}{{ x is not none }}{{ l is sequence }}{{ 1 is number }}{{ true is boolean }}",
       R"({"x": 1, "n": null, "s": "t", "d": {}, "l": []})", "truefalsetruetruetruetruetruefalsetruetruetruetruetrue"},
      {"concat", "{{ 'a' ~ 1 ~ 2.5 ~ true }} {{ 'n' + 1 }} {{ [1] + [2] }}", "{}", "a12.5true n1 [1, 2]"},
      {"filters_str",
       "[{{ '  x y \n'|trim }}]{{ 'ab'|upper }}{{ 'AB'|lower }}{{ 'ab'|length }}{{ '\xF0\x9F\x98\x80'|length }}{{ 'a-b'|replace('-', '+') }}"
       "{{ 'hello world'|title }}{{ 'hi'|capitalize }}",
       "{}", "[x y]ABab22a+bHello WorldHi"},
      {"filters_list",
       "{{ xs|length }}{{ xs|first }}{{ xs|last }}{{ xs|join(', ') }}|{{ xs|reverse|join }}|{{ [3, 1, 2]|sort }}{{ [1, 1, 2]|unique }}",
       R"({"xs": ["a", "b", "c"]})", "3aca, b, c|cba|[1, 2, 3][1, 2]"},
      {"default", "{{ u|default('d') }}{{ ''|default('e') }}{{ ''|default('f', true) }}{{ 0|default(5) }}", "{}", "df0"},
      {"tojson",
       "{{ d|tojson }}\n{{ d|tojson(indent=2) }}\n{{ 'é\"\n'|tojson }}{{ 'é'|tojson(ensure_ascii=true) }}{{ [] |tojson(indent=4) }}"
       "{{ 1.0|tojson }}{{ d|tojson(separators=(',', ':')) }}",
       R"({"d": {"b": [1, "x"], "a": {}}})",
       "{\"b\": [1, \"x\"], \"a\": {}}\n{\n  \"b\": [\n    1,\n    \"x\"\n  ],\n  \"a\": {}\n}\n\"\xC3\xA9\\\"\\n\"\"\\u00e9\"[]1"
       "{\"b\":[1,\"x\"],\"a\":{}}"},
      {"selectattr",
       "{{ ms|selectattr('role', 'equalto', 'user')|map(attribute='c')|join(',') }}|{{ ms|rejectattr('role', 'equalto', 'user')|length }}"
       "|{{ ms|selectattr('x')|length }}",
       R"({"ms": [{"role": "user", "c": "1"}, {"role": "bot", "c": "2", "x": true}, {"role": "user", "c": "3"}]})", "1,3|1|1"},
      {"str_methods",
       "{{ s.startswith('<a') }}{{ s.endswith(('x', 'b>')) }}{{ s.split('|') }}{{ '  p q '.split() }}{{ ' x '.strip() }}."
       "{{ '\n\ny'.lstrip('\n') }}{{ 'y\n'.rstrip() }}{{ 'aXbX'.replace('X', '-', 1) }}{{ 'Ab'.upper() }}{{ 'Ab'.lower() }}",
       R"({"s": "<a|b>"})", "truetrue[\"<a\", \"b>\"][\"p\", \"q\"]x.yya-bXABab"},
      {"dict_methods", "{{ d.get('a') }}{{ d.get('z', 'dflt') }}{{ d.keys() }}{{ d.items() }}{{ d['a'] }}{{ d.a }}",
       R"({"d": {"a": 1, "b": 2}})", "1dflt[\"a\", \"b\"][[\"a\", 1], [\"b\", 2]]11"},
      {"ternary", "{{ 'y' if x else 'n' }}{{ 'y' if not x else 'n' }}", R"({"x": true})", "yn"},
      {"unicode_trim", "[{{ s|trim }}]", "{\"s\": \"\\u3000 \\u00a0\u4F60\u597D\\u3000\"}", "[\xE4\xBD\xA0\xE5\xA5\xBD]"},
      {"indent_filter", "{{ 'a\nb\n\nc'|indent(2) }}|{{ 'a\nb'|indent(2, true) }}", "{}", "a\n  b\n\n  c|  a\n  b"},
      {"int_float", "{{ '42'|int + 1 }} {{ '2.5'|float }} {{ 3.7|int }} {{ 'x'|int }}", "{}", "43 2.5 3 0"},
      {"range", "{% for i in range(3) %}{{ i }}{% endfor %}{% for i in range(1, 7, 2) %}{{ i }}{% endfor %}", "{}", "012135"},
      {"chatml",
       "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}"
       "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}",
       R"({"messages": [{"role": "user", "content": "Hi"}], "add_generation_prompt": true})",
       "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"},
  };
  return cases;
}
