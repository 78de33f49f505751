use serde_json::json;

use super::*;

fn parse(input: Value) -> Result<Params, String> {
    Params::parse(&input, 2048)
}

#[test]
fn prompt_defaults() {
    let params = parse(json!({"prompt": "hi"})).unwrap();
    assert_eq!(
        params,
        Params {
            prompt: Prompt::Chat(vec![Message {
                role: Role::User,
                content: "hi".into(),
                tool_calls: vec![],
            }]),
            max_tokens: None,
            sampling: Sampling::default(),
            stop: vec![],
            ignore_eos: false,
            n: 1,
            logprobs: None,
            grammar: None,
            tools: None,
        }
    );
}

#[test]
fn all_fields() {
    let params = parse(json!({
        "prompt": "Once", "raw": true, "max_tokens": 7, "temperature": 0, "top_p": 0.5,
        "top_k": 40, "stop": ["\n", "END"], "seed": u64::MAX
    }))
    .unwrap();
    assert_eq!(params.prompt, Prompt::Raw("Once".into()));
    assert_eq!(params.max_tokens, Some(7));
    assert_eq!(
        params.sampling,
        Sampling {
            temperature: 0.0,
            top_p: 0.5,
            top_k: 40,
            seed: Some(u64::MAX),
            ..Sampling::default()
        }
    );
    assert!(params.sampling.is_greedy());
    assert_eq!(params.stop, vec!["\n".to_owned(), "END".to_owned()]);
    assert_eq!(
        parse(json!({"prompt": "a", "stop": "x"})).unwrap().stop,
        vec!["x".to_owned()]
    );
    assert!(parse(json!({"prompt": "a", "stop": []})).unwrap().stop.is_empty());
    assert!(parse(json!({"prompt": "a", "ignore_eos": true})).unwrap().ignore_eos);
    assert_eq!(
        parse(json!({"prompt": "a", "ignore_eos": 1})).unwrap_err(),
        "ignore_eos: must be a boolean, not a number"
    );
    // null reads as absent
    assert_eq!(
        parse(
            json!({"prompt": "a", "seed": null, "stop": null, "max_tokens": null, "tools": null,
            "response_format": null, "logit_bias": null, "raw": null})
        )
        .unwrap(),
        parse(json!({"prompt": "a"})).unwrap()
    );
    // a whole number is an integer, as JSON Schema counts it
    let whole = parse(json!({"prompt": "a", "max_tokens": 7.0, "n": 2.0, "top_k": 3.0})).unwrap();
    assert_eq!((whole.max_tokens, whole.n, whole.sampling.top_k), (Some(7), 2, 3));
}

#[test]
fn messages() {
    let params = parse(json!({"messages": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi", "name": "ann"},
        {"role": "assistant", "content": "Hello"},
        {"role": "user", "content": ""},
    ]}))
    .unwrap();
    let Prompt::Chat(messages) = params.prompt else {
        panic!("not a chat");
    };
    assert_eq!(
        messages.iter().map(|m| m.role).collect::<Vec<_>>(),
        [Role::System, Role::User, Role::Assistant, Role::User]
    );
    assert_eq!(messages[0].content, "Be brief.");
}

#[test]
fn every_problem_is_reported() {
    let error = parse(json!({
        "prompt": 3, "max_tokens": 0, "temperature": 2.5, "top_p": 0, "top_k": -1,
        "stop": ["a", ""], "seed": -4, "raw": "yes", "extra": 1
    }))
    .unwrap_err();
    let mut parts: Vec<&str> = error.split("; ").collect();
    parts.sort_unstable();
    assert_eq!(
        parts,
        [
            "extra: unknown property",
            "max_tokens: must be an integer from 1 to the model's context length",
            "prompt: must be a string, not a number",
            "raw: must be a boolean, not a string",
            "seed: must be an integer from 0 to 18446744073709551615 (got -4)",
            "stop: must be a non-empty string or an array of at most 4 non-empty strings",
            "temperature: must be a number from 0 to 2 (got 2.5)",
            "top_k: must be an integer from 0 to 2147483647 (got -1)",
            "top_p: must be a number above 0 and at most 1 (got 0)",
        ],
        "{error}"
    );
}

#[test]
fn bad_inputs() {
    for (input, needle) in [
        (json!("hello"), "must be a JSON object, not a string"),
        (
            json!({}),
            "one of `prompt` (a string) or `messages` (an array) is required",
        ),
        (
            json!({"prompt": "a", "messages": [{"role": "user", "content": "b"}]}),
            "give either `prompt` or `messages`, not both",
        ),
        (json!({"messages": []}), "messages: must not be empty"),
        (json!({"messages": "hi"}), "messages: must be an array, not a string"),
        (
            json!({"messages": [1]}),
            "messages.0: must be a JSON object, not a number",
        ),
        (
            json!({"messages": [{"role": "bot", "content": "x"}]}),
            "messages.0.role: must be one of system, user, assistant, tool (got 'bot')",
        ),
        (
            json!({"messages": [{"role": 1, "content": "x"}]}),
            "messages.0.role: must be a string, not a number",
        ),
        (
            json!({"messages": [{"content": "x"}]}),
            "messages.0.role: required property is missing",
        ),
        (
            json!({"messages": [{"role": "user"}]}),
            "`messages[0].content` must be a string",
        ),
        (
            json!({"messages": [{"role": "user", "content": 5}]}),
            "messages.0.content: must be a string, not a number",
        ),
        (
            json!({"messages": [{"role": "user", "content": "x", "nam": "n"}]}),
            "messages.0.nam: unknown property",
        ),
        (
            json!({"messages": [{"role": "tool", "content": "x", "tool_call_id": 1}]}),
            "messages.0.tool_call_id: must be a string, not a number",
        ),
        (
            json!({"messages": [{"role": "user", "content": "x"}], "raw": true}),
            "`raw` applies only to `prompt`; `messages` always use the chat template",
        ),
        (
            json!({"prompt": "a", "max_tokens": 2049}),
            "`max_tokens` must be an integer from 1 to 2048, got 2049",
        ),
        (
            json!({"prompt": "a", "max_tokens": 1.5}),
            "max_tokens: must be an integer from 1 to the model's context length",
        ),
        (
            json!({"prompt": "a", "temperature": "hot"}),
            "temperature: must be a number, not a string",
        ),
        (
            json!({"prompt": "a", "top_p": 1.01}),
            "top_p: must be a number above 0 and at most 1 (got 1.01)",
        ),
        (
            json!({"prompt": "a", "top_k": 1u64 << 40}),
            "top_k: must be an integer from 0 to 2147483647 (got 1099511627776)",
        ),
        (
            json!({"prompt": "a", "stop": ["a", "b", "c", "d", "e"]}),
            "stop: must be",
        ),
        (json!({"prompt": "a", "stop": ""}), "stop: must be"),
        (json!({"prompt": "a", "stop": [1]}), "stop: must be"),
        (
            json!({"prompt": "a", "seed": 1.5}),
            "seed: must be an integer from 0 to 18446744073709551615, not a fractional number",
        ),
        (
            json!({"prompt": "a\u{0}b"}),
            "`prompt` must not contain NUL characters (unless `raw` is true)",
        ),
        (
            json!({"messages": [{"role": "user", "content": "a\u{0}"}]}),
            "messages.0.content: must not contain NUL characters",
        ),
    ] {
        let error = parse(input.clone()).unwrap_err();
        assert!(error.contains(needle), "{input}: {error}");
    }
    // NUL is fine in a raw prompt: it is tokenized as is.
    assert!(parse(json!({"prompt": "a\u{0}b", "raw": true})).is_ok());
}

#[test]
fn rules_between_members_wait_for_well_formed_members() {
    // The members' own failures first; the rules between them once each
    // member is well formed.
    let error = parse(json!({"messages": [{"role": "user", "content": "x"}], "raw": true, "n": 0})).unwrap_err();
    assert_eq!(error, "n: must be an integer from 1 to 8 (got 0)");
    let error =
        parse(json!({"messages": [{"role": "user", "content": "x"}], "raw": true, "max_tokens": 5000})).unwrap_err();
    assert_eq!(
        error,
        "`raw` applies only to `prompt`; `messages` always use the chat template; \
         `max_tokens` must be an integer from 1 to 2048, got 5000"
    );
}

#[test]
fn openai_sampling_fields() {
    let params = parse(json!({
        "prompt": "a", "min_p": 0.05, "presence_penalty": 1.5, "frequency_penalty": -0.5,
        "logit_bias": {"42": -100, "7": 3.5}, "n": 3, "logprobs": true, "top_logprobs": 2
    }))
    .unwrap();
    assert_eq!(params.sampling.min_p, 0.05);
    assert_eq!(params.sampling.presence_penalty, 1.5);
    assert_eq!(params.sampling.frequency_penalty, -0.5);
    let mut biases = params.sampling.logit_bias.clone();
    biases.sort_by_key(|b| b.0);
    assert_eq!(biases, [(7, 3.5), (42, -100.0)]);
    assert_eq!((params.n, params.logprobs), (3, Some(2)));
    assert_eq!(
        parse(json!({"prompt": "a", "logprobs": true})).unwrap().logprobs,
        Some(0)
    );
    assert_eq!(parse(json!({"prompt": "a", "logprobs": false})).unwrap().logprobs, None);
    for (input, needle) in [
        (
            json!({"prompt": "a", "n": 9}),
            "n: must be an integer from 1 to 8 (got 9)",
        ),
        (
            json!({"prompt": "a", "n": 0}),
            "n: must be an integer from 1 to 8 (got 0)",
        ),
        (
            json!({"prompt": "a", "min_p": 1.5}),
            "min_p: must be a number from 0 to 1 (got 1.5)",
        ),
        (
            json!({"prompt": "a", "presence_penalty": 2.5}),
            "presence_penalty: must be a number from -2 to 2 (got 2.5)",
        ),
        (
            json!({"prompt": "a", "frequency_penalty": "x"}),
            "frequency_penalty: must be a number, not a string",
        ),
        (
            json!({"prompt": "a", "logit_bias": {"x": 1}}),
            "logit_bias.x: the key must be a token id, a string of digits",
        ),
        (
            json!({"prompt": "a", "logit_bias": {"-3": 1}}),
            "logit_bias.-3: the key must be a token id",
        ),
        (
            json!({"prompt": "a", "logit_bias": {"1": 101}}),
            "logit_bias.1: must be a number from -100 to 100 (got 101)",
        ),
        (
            json!({"prompt": "a", "logit_bias": [1]}),
            "logit_bias: must be a JSON object, not an array",
        ),
        (
            json!({"prompt": "a", "top_logprobs": 2}),
            "`top_logprobs` needs `logprobs: true`",
        ),
        (
            json!({"prompt": "a", "logprobs": true, "top_logprobs": 21}),
            "top_logprobs: must be an integer from 0 to 20 (got 21)",
        ),
    ] {
        let error = parse(input.clone()).unwrap_err();
        assert!(error.contains(needle), "{input}: {error}");
    }
}

#[test]
fn response_formats() {
    assert!(
        parse(json!({"prompt": "a", "response_format": {"type": "text"}}))
            .unwrap()
            .grammar
            .is_none()
    );
    let object = parse(json!({"prompt": "a", "response_format": {"type": "json_object"}})).unwrap();
    assert!(object.grammar.unwrap().text.starts_with("root ::= object"));
    let schema = parse(json!({"prompt": "a", "response_format": {"type": "json_schema",
        "json_schema": {"name": "x", "strict": true, "schema": {"type": "object",
            "properties": {"a": {"type": "integer"}}, "required": ["a"]}}}}))
    .unwrap();
    assert!(schema.grammar.unwrap().trigger.is_none());
    // no schema: any object
    let any = parse(json!({"prompt": "a", "response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}))
        .unwrap();
    assert!(any.grammar.unwrap().text.starts_with("root ::= object"));
    for (format, needle) in [
        (json!("json"), "response_format: must be a JSON object, not a string"),
        (
            json!({"type": "yaml"}),
            "response_format.type: must be one of text, json_object, json_schema (got 'yaml')",
        ),
        (json!({}), "response_format.type: required property is missing"),
        (
            json!({"type": "json_schema"}),
            "`response_format.json_schema` must be an object with `name` and `schema`",
        ),
        (
            json!({"type": "text", "json_schema": {"name": "x"}}),
            "`response_format`: unknown field `json_schema`",
        ),
        (
            json!({"type": "json_object", "strict": true}),
            "response_format.strict: unknown property",
        ),
        (
            json!({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "string", "pattern": "a+"}}}),
            "`response_format.json_schema.schema` cannot be enforced: at /: the keyword `pattern`",
        ),
        (
            json!({"type": "json_schema", "json_schema": {"name": "x", "shema": {}}}),
            "response_format.json_schema.shema: unknown property",
        ),
        (
            json!({"type": "json_schema", "json_schema": {"name": 1}}),
            "response_format.json_schema.name: must be a string, not a number",
        ),
        (
            json!({"type": "json_schema", "json_schema": {"schema": "object"}}),
            "response_format.json_schema.schema: must be a JSON Schema (an object or a boolean), not a string",
        ),
    ] {
        let error = parse(json!({"prompt": "a", "response_format": format})).unwrap_err();
        assert!(error.contains(needle), "{format}: {error}");
    }
    let error =
        parse(json!({"prompt": "a", "ignore_eos": true, "response_format": {"type": "json_object"}})).unwrap_err();
    assert!(error.contains("`ignore_eos` cannot be combined"), "{error}");
}

#[test]
fn tools_and_tool_messages() {
    let tools = json!([{"type": "function", "function": {"name": "get_weather", "description": "Weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]);
    let params = parse(json!({"messages": [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}, "index": 0}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
        {"role": "assistant", "tool_calls": [{"function": {"name": "get_weather", "arguments": {"city": "Rome"}}},
            {"function": {"name": "get_weather"}}]},
    ], "tools": tools, "tool_choice": "required"}))
    .unwrap();
    let Prompt::Chat(messages) = &params.prompt else {
        panic!("not a chat")
    };
    assert_eq!(messages[1].tool_calls[0].name, "get_weather");
    assert_eq!(messages[1].tool_calls[0].id, "call_1");
    assert_eq!(messages[1].content, "");
    assert_eq!(messages[2].role, Role::Tool);
    // arguments given as an object are kept as its text; none are `{}`
    assert_eq!(messages[3].tool_calls[0].arguments, r#"{"city":"Rome"}"#);
    assert_eq!(messages[3].tool_calls[1].arguments, "{}");
    assert_eq!(messages[3].tool_calls[1].id, "");
    assert_eq!(params.tools.as_ref().unwrap().choice, ToolChoice::Required);
    assert!(params.tools.as_ref().unwrap().parallel);
    assert!(params.grammar.as_ref().unwrap().trigger.is_none());
    // auto is lazy; none offers nothing
    let auto = parse(json!({"prompt": "a", "tools": tools, "parallel_tool_calls": false})).unwrap();
    assert!(!auto.tools.as_ref().unwrap().parallel);
    assert_eq!(auto.grammar.unwrap().trigger.as_deref(), Some("<tool_call>"));
    let none = parse(json!({"prompt": "a", "tools": tools, "tool_choice": "none"})).unwrap();
    assert!(none.tools.is_none() && none.grammar.is_none());
    let named = parse(json!({"prompt": "a", "tools": tools,
        "tool_choice": {"type": "function", "function": {"name": "get_weather"}}}))
    .unwrap();
    assert_eq!(named.tools.unwrap().choice, ToolChoice::Named("get_weather".into()));
    // calls only: the answer's text format does not apply
    let forced = parse(json!({"prompt": "a", "tools": tools, "tool_choice": "required",
        "response_format": {"type": "json_object"}}))
    .unwrap();
    assert!(forced.grammar.unwrap().trigger.is_none());
    let many: Vec<Value> = (0..=MAX_TOOLS)
        .map(|i| json!({"type": "function", "function": {"name": format!("f{i}")}}))
        .collect();
    for (input, needle) in [
        (
            json!({"prompt": "a", "tools": tools, "tool_choice": {"type": "function", "function": {"name": "nope"}}}),
            "`tool_choice` names `nope`, which is not in `tools`",
        ),
        (
            json!({"prompt": "a", "tool_choice": "required"}),
            "`tool_choice` needs `tools`",
        ),
        (
            json!({"prompt": "a", "tool_choice": "maybe"}),
            "tool_choice: must be one of none, auto, required (got 'maybe') or a function",
        ),
        (
            json!({"prompt": "a", "tool_choice": 3}),
            "tool_choice: must be a string or an object, not a number",
        ),
        (
            json!({"prompt": "a", "tools": tools, "tool_choice": {"type": "function"}}),
            r#"tool_choice: must be {"type": "function", "function": {"name": ...}} when an object"#,
        ),
        (
            json!({"prompt": "a", "tools": [{"type": "function", "function": {"name": "a b"}}]}),
            "tools.0.function.name: must be 1 to 64 letters, digits, underscores or dashes (got 'a b')",
        ),
        (
            json!({"prompt": "a", "tools": [{"type": "tool", "function": {"name": "f"}}]}),
            "tools.0.type: must be one of function (got 'tool')",
        ),
        (
            json!({"prompt": "a", "tools": [{"function": {"name": "f"}}]}),
            "tools.0.type: required property is missing",
        ),
        (
            json!({"prompt": "a", "tools": [{"type": "function", "function": {"name": "f", "parameters": []}}]}),
            "tools.0.function.parameters: must be a JSON Schema object, not an array",
        ),
        (
            json!({"prompt": "a", "tools": [{"type": "function", "function": {"name": "f", "strict": true, "x": 1}}]}),
            "tools.0.function.x: unknown property",
        ),
        (
            json!({"prompt": "a", "tools": many}),
            "tools: must be an array of 0 to 128 entries (got 129)",
        ),
        (
            json!({"prompt": "a", "tools": [{"type": "function", "function": {"name": "f"}},
                {"type": "function", "function": {"name": "f"}}]}),
            "`tools[1]`: the name `f` is used twice",
        ),
        (
            json!({"prompt": "a", "tools": [{"type": "function", "function": {"name": "f",
            "parameters": {"type": "object", "properties": {"x": {"type": "string", "pattern": "x"}}}}}]}),
            "`tools[0].function.parameters/properties/x`",
        ),
        (
            json!({"prompt": "a", "raw": true, "tools": tools}),
            "`tools` need a chat: send `messages` (or a `prompt` without `raw`)",
        ),
        (
            json!({"prompt": "a", "tools": tools, "response_format": {"type": "json_object"}}),
            "`response_format` with `tools` and `tool_choice: auto` is not supported",
        ),
        (
            json!({"messages": [{"role": "user", "content": "a", "tool_calls": []}]}),
            "`messages[0].tool_calls`: only assistant messages make calls",
        ),
        (
            json!({"messages": [{"role": "assistant", "tool_calls": []}]}),
            "`messages[0].content` must be a string",
        ),
        (
            json!({"messages": [{"role": "assistant", "tool_calls": [{"id": "c"}]}]}),
            "messages.0.tool_calls.0.function: required property is missing",
        ),
        (
            json!({"messages": [{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": 1}}]}]}),
            "messages.0.tool_calls.0.function.arguments: must be a string (the arguments object as JSON text) \
             or an object, not a number",
        ),
        (
            json!({"messages": [{"role": "assistant", "tool_calls": [{"function": {"name": "f\u{0}"}}]}]}),
            "messages.0.tool_calls.0.function.name: must not contain NUL characters",
        ),
    ] {
        let error = parse(input.clone()).unwrap_err();
        assert!(error.contains(needle), "{input}: {error}");
    }
}

/// The schema of each built-in entry says what its hand-written schema
/// said: every property with its bounds, defaults, enums and descriptions,
/// `required` and `additionalProperties`, and the choice between `prompt`
/// and `messages`; `max_tokens` is bounded by the entry's context.
#[test]
fn the_schemas_of_the_builtin_entries_state_the_old_facts() {
    let manifest = gantry_manifest::Manifest::builtin();
    for (id, context) in [("smollm2-135m-instruct", 8192), ("gemma-3-270m-it", 32768)] {
        let entry = manifest.get(id).unwrap();
        let schema = schema(entry);
        let whole = schema.to_string();
        assert!(
            !whole.contains("\"$ref\"") && !whole.contains("\"null\""),
            "{id}: {whole}"
        );
        assert_eq!(schema["type"], "object");
        assert_eq!(schema["additionalProperties"], false);
        assert_eq!(
            schema["oneOf"],
            json!([{"required": ["prompt"]}, {"required": ["messages"]}])
        );
        assert!(schema.get("required").is_none_or(|r| r == &json!([])), "{whole}");
        let p = &schema["properties"];
        let mut names: Vec<&str> = p.as_object().unwrap().keys().map(String::as_str).collect();
        names.sort_unstable();
        assert_eq!(
            names,
            [
                "frequency_penalty",
                "ignore_eos",
                "logit_bias",
                "logprobs",
                "max_tokens",
                "messages",
                "min_p",
                "n",
                "parallel_tool_calls",
                "presence_penalty",
                "prompt",
                "raw",
                "response_format",
                "seed",
                "stop",
                "temperature",
                "tool_choice",
                "tools",
                "top_k",
                "top_logprobs",
                "top_p",
            ]
        );
        let has = |member: &str, key: &str, value: Value| {
            assert_eq!(p[member][key], value, "{id}: {member}.{key} in {}", p[member]);
        };
        let says = |member: &Value, words: &str| {
            let description = member["description"].as_str().unwrap_or_default().replace('\n', " ");
            assert!(description.contains(words), "{id}: {words:?} in {member}");
        };
        has("prompt", "type", json!("string"));
        says(&p["prompt"], "The text to continue (or the user message, unless raw).");
        has("max_tokens", "type", json!("integer"));
        has("max_tokens", "minimum", json!(1));
        has("max_tokens", "maximum", json!(context));
        has("max_tokens", "default", json!(512));
        says(&p["max_tokens"], "Most tokens to generate");
        for (member, minimum, maximum) in [
            ("temperature", json!(0), json!(2)),
            ("min_p", json!(0), json!(1)),
            ("presence_penalty", json!(-2), json!(2)),
            ("frequency_penalty", json!(-2), json!(2)),
        ] {
            has(member, "type", json!("number"));
            has(member, "minimum", minimum);
            has(member, "maximum", maximum);
        }
        has("top_p", "type", json!("number"));
        has("top_p", "exclusiveMinimum", json!(0));
        has("top_p", "maximum", json!(1));
        has("top_k", "type", json!("integer"));
        has("top_k", "minimum", json!(0));
        has("seed", "type", json!("integer"));
        has("seed", "minimum", json!(0));
        has("n", "minimum", json!(1));
        has("n", "maximum", json!(8));
        has("n", "default", json!(1));
        has("top_logprobs", "minimum", json!(0));
        has("top_logprobs", "maximum", json!(20));
        for (member, default) in [
            ("ignore_eos", false),
            ("logprobs", false),
            ("parallel_tool_calls", true),
            ("raw", false),
        ] {
            has(member, "type", json!("boolean"));
            has(member, "default", json!(default));
        }
        says(&p["temperature"], "Sampling temperature; 0 is greedy.");
        says(&p["top_p"], "Nucleus sampling mass");
        says(&p["top_k"], "Sample among the k likeliest tokens; 0 turns it off.");
        says(&p["seed"], "Seed of the sampler, for repeatable output");
        says(&p["raw"], "Pass the prompt as is, without the chat template");
        says(&p["ignore_eos"], "Never end at the model's end-of-sequence tokens");
        says(&p["ignore_eos"], "Not with response_format or tools.");
        says(
            &p["min_p"],
            "Drop tokens less likely than min_p times the likeliest one; 0 turns it off.",
        );
        says(
            &p["presence_penalty"],
            "Subtracted once from the logit of every token already generated.",
        );
        says(
            &p["frequency_penalty"],
            "Subtracted from a token's logit for every time it was generated.",
        );
        says(
            &p["logit_bias"],
            "Token id (as a string of digits) to a bias added to its logit",
        );
        says(
            &p["n"],
            "Choices to generate; every choice's tokens are billed, the prompt once.",
        );
        says(&p["logprobs"], "Report each generated token's log-probability");
        says(&p["top_logprobs"], "Alternatives reported per token; needs logprobs.");
        says(&p["stop"], "Generation ends before any of these strings");
        says(
            &p["response_format"],
            "A schema the grammar cannot express (pattern, not, multipleOf, ...) is refused.",
        );
        says(&p["tools"], "Functions the model may call, as OpenAI describes them");
        says(
            &p["tool_choice"],
            "auto (the default with tools): text or calls; required: calls only;",
        );
        says(&p["parallel_tool_calls"], "only 1 when false");
        // logit_bias: token ids to numbers from -100 to 100
        has("logit_bias", "type", json!("object"));
        let bias = &p["logit_bias"]["additionalProperties"];
        assert_eq!(
            (&bias["type"], &bias["minimum"], &bias["maximum"]),
            (&json!("number"), &json!(-100), &json!(100))
        );
        // stop: a string, or at most 4 of them
        assert_eq!(p["stop"]["oneOf"][0]["type"], "string");
        assert_eq!(p["stop"]["oneOf"][1]["type"], "array");
        assert_eq!(p["stop"]["oneOf"][1]["maxItems"], 4);
        assert_eq!(p["stop"]["oneOf"][1]["items"]["type"], "string");
        // messages
        let messages = &p["messages"];
        assert_eq!((&messages["type"], &messages["minItems"]), (&json!("array"), &json!(1)));
        says(
            messages,
            "A chat: messages in order, formatted with the model's chat template.",
        );
        let message = &messages["items"];
        assert_eq!(message["required"], json!(["role"]));
        assert_eq!(message["additionalProperties"], false);
        assert_eq!(
            message["properties"]["role"]["enum"],
            json!(["system", "user", "assistant", "tool"])
        );
        assert_eq!(message["properties"]["content"]["type"], "string");
        says(
            &message["properties"]["content"],
            "null only in an assistant message with tool_calls",
        );
        assert_eq!(message["properties"]["name"]["type"], "string");
        assert_eq!(message["properties"]["tool_call_id"]["type"], "string");
        says(
            &message["properties"]["tool_call_id"],
            "In a tool message: the call whose result this is.",
        );
        let calls = &message["properties"]["tool_calls"];
        assert_eq!(calls["type"], "array");
        says(
            calls,
            "The function calls an assistant message made, as OpenAI writes them.",
        );
        assert_eq!(calls["items"]["required"], json!(["function"]));
        assert_eq!(calls["items"]["properties"]["id"]["type"], "string");
        assert_eq!(calls["items"]["properties"]["type"]["enum"], json!(["function"]));
        let called = &calls["items"]["properties"]["function"];
        assert_eq!(called["required"], json!(["name"]));
        assert_eq!(called["properties"]["name"]["type"], "string");
        says(&called["properties"]["arguments"], "The arguments object as JSON text");
        // response_format: text or any object, or JSON matching a schema
        let format = &p["response_format"];
        assert_eq!(format["type"], "object");
        assert_eq!(format["required"], json!(["type"]));
        assert_eq!(format["additionalProperties"], false);
        assert_eq!(
            format["properties"]["type"]["enum"],
            json!(["text", "json_object", "json_schema"])
        );
        assert_eq!(
            format["oneOf"][0]["properties"]["type"]["enum"],
            json!(["text", "json_object"])
        );
        assert_eq!(format["oneOf"][1]["required"], json!(["json_schema"]));
        let spec = &format["properties"]["json_schema"];
        assert_eq!(
            (&spec["type"], &spec["additionalProperties"]),
            (&json!("object"), &json!(false))
        );
        for (member, kind) in [
            ("name", json!("string")),
            ("description", json!("string")),
            ("schema", json!(["object", "boolean"])),
            ("strict", json!("boolean")),
        ] {
            assert_eq!(spec["properties"][member]["type"], kind, "{member}");
        }
        // tools
        let tools = &p["tools"];
        assert_eq!((&tools["type"], &tools["maxItems"]), (&json!("array"), &json!(128)));
        let tool = &tools["items"];
        assert_eq!(tool["required"], json!(["type", "function"]));
        assert_eq!(tool["additionalProperties"], false);
        assert_eq!(tool["properties"]["type"]["enum"], json!(["function"]));
        let function = &tool["properties"]["function"];
        assert_eq!(function["required"], json!(["name"]));
        assert_eq!(function["additionalProperties"], false);
        assert_eq!(function["properties"]["name"]["pattern"], "^[A-Za-z0-9_-]{1,64}$");
        assert_eq!(function["properties"]["description"]["type"], "string");
        assert_eq!(function["properties"]["parameters"]["type"], "object");
        assert_eq!(function["properties"]["strict"]["type"], "boolean");
        // tool_choice: a word, or a function by name
        let choice = &p["tool_choice"]["oneOf"];
        assert_eq!(choice[0]["enum"], json!(["none", "auto", "required"]));
        assert_eq!(choice[1]["required"], json!(["type", "function"]));
        assert_eq!(choice[1]["properties"]["type"]["enum"], json!(["function"]));
        assert_eq!(choice[1]["properties"]["function"]["required"], json!(["name"]));
    }
}

/// The schema's bounds are the reader's: a value at each bound is taken,
/// one past it refused.
#[test]
fn the_schema_bounds_are_the_readers() {
    let mut engine = serde_json::Map::new();
    engine.insert("context_tokens".into(), json!(2048));
    let entry = gantry_manifest::Manifest::builtin()
        .get("smollm2-135m-instruct")
        .unwrap();
    let entry = ModelEntry {
        engine,
        ..entry.clone()
    };
    let schema = schema(&entry);
    let p = &schema["properties"];
    for member in [
        "max_tokens",
        "temperature",
        "min_p",
        "presence_penalty",
        "top_k",
        "n",
        "top_logprobs",
    ] {
        let (low, high) = (p[member]["minimum"].clone(), p[member]["maximum"].clone());
        let with = |value: &Value| {
            let mut input = json!({"prompt": "a", "logprobs": true});
            input[member] = value.clone();
            parse(input)
        };
        assert!(with(&low).is_ok() && with(&high).is_ok(), "{member}");
        let below = json!(low.as_f64().unwrap() - 1.0);
        let above = json!(high.as_f64().unwrap() + 1.0);
        assert!(with(&below).is_err() && with(&above).is_err(), "{member}");
    }
}
