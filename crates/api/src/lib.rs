//! The HTTP facade. Routing, extractors, problem+json and headers live here;
//! business rules live in the service crates.
mod app;
mod body;
mod connection;
mod console;
mod handlers;
mod middleware;
mod openapi;
mod problem;
mod query;
mod routes;
mod state;

pub use actix_web::dev::ServerHandle;
pub use app::{Application, HttpConfig, ListenError, metrics_server, process_metrics_server};
pub use openapi::{openapi_document, openapi_json, public_openapi_document, public_openapi_json};
pub use problem::{ApiError, Problem};
pub use routes::{Endpoint, management_endpoints, public_endpoints};
pub use state::{AppState, ConsoleConfig, Services, Surface};

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use std::collections::{BTreeMap, BTreeSet};
    use std::path::Path;

    /// The crate's top-level modules and the ones each imports (`crate::x`),
    /// read from the code that ships (unit tests left out).
    fn imports() -> BTreeMap<String, BTreeSet<String>> {
        fn walk(dir: &Path, root: &Path, graph: &mut BTreeMap<String, BTreeSet<String>>) {
            for entry in std::fs::read_dir(dir).unwrap() {
                let path = entry.unwrap().path();
                if path.is_dir() {
                    walk(&path, root, graph);
                    continue;
                }
                if path.extension().is_none_or(|ext| ext != "rs") {
                    continue;
                }
                let relative = path.strip_prefix(root).unwrap();
                let first = relative.components().next().unwrap().as_os_str().to_string_lossy();
                let module = first.trim_end_matches(".rs").to_owned();
                if module == "lib" {
                    continue;
                }
                let text = std::fs::read_to_string(&path).unwrap();
                let shipped = text.split("#[cfg(test)]\nmod ").next().unwrap_or_default();
                let uses = graph.entry(module.clone()).or_default();
                for (at, _) in shipped.match_indices("crate::") {
                    let name: String = shipped[at + 7..]
                        .chars()
                        .take_while(|c| c.is_ascii_lowercase() || *c == '_')
                        .collect();
                    if !name.is_empty() && name != module {
                        uses.insert(name);
                    }
                }
            }
        }
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut graph = BTreeMap::new();
        walk(&root, &root, &mut graph);
        graph
    }

    /// A module imported by one it imports (directly or not) is a circle:
    /// `state` is a leaf, the handlers sit above it, the routes above them,
    /// and the application on top.
    #[test]
    fn the_modules_import_each_other_without_circles() {
        let graph = imports();
        assert!(graph.len() >= 10, "the scan reads the modules: {graph:?}");
        assert_eq!(graph["state"], BTreeSet::new(), "state imports nothing of the crate");
        assert_eq!(
            graph["problem"],
            BTreeSet::new(),
            "problem imports nothing of the crate"
        );
        // Depth-first, keeping the path: meeting a module on the path closes a circle.
        fn visit<'g>(
            module: &'g str,
            graph: &'g BTreeMap<String, BTreeSet<String>>,
            path: &mut Vec<&'g str>,
            done: &mut BTreeSet<&'g str>,
        ) -> Result<(), String> {
            if let Some(at) = path.iter().position(|m| *m == module) {
                return Err(format!("{} -> {module}", path[at..].join(" -> ")));
            }
            if !done.insert(module) {
                return Ok(());
            }
            path.push(module);
            for next in graph.get(module).into_iter().flatten() {
                visit(next, graph, path, done)?;
            }
            path.pop();
            Ok(())
        }
        let mut done = BTreeSet::new();
        for module in graph.keys() {
            if let Err(circle) = visit(module, &graph, &mut Vec::new(), &mut done) {
                panic!("an import circle: {circle}");
            }
        }
    }
}
