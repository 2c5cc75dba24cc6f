package warden_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// The portable packages whose functions the documentation's snippets call.
var documentedPackages = []string{".", "lock", "breaker", "cache", "idempotency", "checkpoint", "scope"}

// signature is what a snippet's call of a package function is checked
// against.
type signature struct {
	params   []ast.Expr // parameter types, one per parameter
	results  int
	variadic bool
}

// sourceFile is a non-test Go file of a documented package, parsed.
type sourceFile struct {
	path string
	src  []byte
	f    *ast.File
}

// packageSources returns the non-test Go files of the documented
// packages, parsed.
func packageSources(t *testing.T) []sourceFile {
	t.Helper()
	var out []sourceFile
	for _, dir := range documentedPackages {
		files, err := filepath.Glob(filepath.Join(dir, "*.go"))
		if err != nil {
			t.Fatal(err)
		}
		for _, path := range files {
			if strings.HasSuffix(path, "_test.go") {
				continue
			}
			src, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			f, err := parser.ParseFile(token.NewFileSet(), path, src, 0)
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, sourceFile{path, src, f})
		}
	}
	return out
}

// packageFuncs returns the exported functions of the documented packages,
// by qualified name ("checkpoint.Run", "warden.Open").
func packageFuncs(t *testing.T) map[string]signature {
	t.Helper()
	funcs := map[string]signature{}
	for _, sf := range packageSources(t) {
		f := sf.f
		for _, d := range f.Decls {
			fd, ok := d.(*ast.FuncDecl)
			if !ok || fd.Recv != nil || !fd.Name.IsExported() {
				continue
			}
			var sig signature
			for _, p := range fd.Type.Params.List {
				for range max(len(p.Names), 1) {
					sig.params = append(sig.params, p.Type)
				}
				if _, ok := p.Type.(*ast.Ellipsis); ok {
					sig.variadic = true
				}
			}
			if fd.Type.Results != nil {
				for _, r := range fd.Type.Results.List {
					sig.results += max(len(r.Names), 1)
				}
			}
			funcs[f.Name.Name+"."+fd.Name.Name] = sig
		}
	}
	return funcs
}

// snippet is a block of example code from a doc comment or a Markdown
// file.
type snippet struct {
	where string
	code  string
}

// docSnippets returns the code blocks of the documented packages' doc
// comments (lines indented by a tab after "//") and of the Markdown files'
// ```go blocks.
func docSnippets(t *testing.T) []snippet {
	t.Helper()
	var out []snippet
	for _, sf := range packageSources(t) {
		path, b := sf.path, sf.src
		var block []string
		start := 0
		flush := func() {
			if len(block) > 0 {
				out = append(out, snippet{where: path + ":" + strconv.Itoa(start), code: strings.Join(block, "\n")})
			}
			block = nil
		}
		for i, line := range strings.Split(string(b), "\n") {
			if code, ok := strings.CutPrefix(line, "//\t"); ok {
				if block == nil {
					start = i + 1
				}
				block = append(block, code)
				continue
			}
			flush()
		}
		flush()
	}
	mds, _ := filepath.Glob(filepath.Join("docs", "*.md"))
	mds = append(mds, "README.md")
	fence := regexp.MustCompile("(?s)```go\n(.*?)```")
	for _, path := range mds {
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range fence.FindAllStringSubmatchIndex(string(b), -1) {
			line := 1 + strings.Count(string(b[:m[2]]), "\n")
			out = append(out, snippet{where: path + ":" + strconv.Itoa(line), code: string(b[m[2]:m[3]])})
		}
	}
	return out
}

// parseSnippet parses a snippet as statements or, failing that, as
// declarations; "…" stands for elided code.
func parseSnippet(code string) ast.Node {
	code = strings.ReplaceAll(code, "…", "")
	if f, err := parser.ParseFile(token.NewFileSet(), "", "package p\nfunc _() {\n"+code+"\n}", 0); err == nil {
		return f
	}
	if f, err := parser.ParseFile(token.NewFileSet(), "", code, 0); err == nil {
		return f
	}
	if f, err := parser.ParseFile(token.NewFileSet(), "", "package p\n"+code, 0); err == nil {
		return f
	}
	return nil
}

// calledFunc returns "pkg.Func" for a call of a package function (with or
// without type arguments).
func calledFunc(call *ast.CallExpr) string {
	fun := call.Fun
	switch f := fun.(type) {
	case *ast.IndexExpr:
		fun = f.X
	case *ast.IndexListExpr:
		fun = f.X
	}
	sel, ok := fun.(*ast.SelectorExpr)
	if !ok {
		return ""
	}
	pkg, ok := sel.X.(*ast.Ident)
	if !ok {
		return ""
	}
	return pkg.Name + "." + sel.Sel.Name
}

// TestDocSnippetsMatchSignatures: every call of a warden function in the
// packages' doc comments and in the Markdown documentation has the
// function's number of arguments, passes a function literal only where the
// function takes a function (closures last: options come before them), and
// is assigned to as many variables as the function returns.
func TestDocSnippetsMatchSignatures(t *testing.T) {
	funcs := packageFuncs(t)
	checked := 0
	for _, s := range docSnippets(t) {
		node := parseSnippet(s.code)
		if node == nil {
			continue // prose indented as code, or a shell session
		}
		check := func(call *ast.CallExpr, lhs int) {
			name := calledFunc(call)
			sig, ok := funcs[name]
			if !ok {
				return
			}
			checked++
			if n := len(call.Args); n != len(sig.params) && !(sig.variadic && n >= len(sig.params)-1) {
				t.Errorf("%s: %s is called with %d arguments, it takes %d", s.where, name, n, len(sig.params))
				return
			}
			for i, a := range call.Args {
				if _, lit := a.(*ast.FuncLit); !lit || i >= len(sig.params) {
					continue
				}
				if _, fn := sig.params[i].(*ast.FuncType); !fn {
					t.Errorf("%s: %s is given a function as argument %d, which is not a function parameter (argument order?)", s.where, name, i+1)
				}
			}
			if lhs > 0 && lhs != sig.results {
				t.Errorf("%s: %s's %d results are assigned to %d variables", s.where, name, sig.results, lhs)
			}
		}
		seen := map[*ast.CallExpr]bool{}
		ast.Inspect(node, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.AssignStmt:
				if len(n.Rhs) == 1 {
					if call, ok := n.Rhs[0].(*ast.CallExpr); ok {
						seen[call] = true
						check(call, len(n.Lhs))
					}
				}
			case *ast.ValueSpec:
				if len(n.Values) == 1 {
					if call, ok := n.Values[0].(*ast.CallExpr); ok {
						seen[call] = true
						check(call, len(n.Names))
					}
				}
			case *ast.CallExpr:
				if !seen[n] {
					check(n, 0)
				}
			}
			return true
		})
	}
	if checked == 0 {
		t.Fatal("no call of a warden function found in the documentation")
	}
}
