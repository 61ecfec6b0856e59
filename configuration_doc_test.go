package valkeystream_test

import (
	"bufio"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/echomq/valkeystream"
)

// configTypes are the exported configuration structs of the package, each
// with a section of docs/configuration.md.
var configTypes = []reflect.Type{
	reflect.TypeFor[valkeystream.SubscriberConfig](),
	reflect.TypeFor[valkeystream.PublisherConfig](),
	reflect.TypeFor[valkeystream.DeadLetterConfig](),
	reflect.TypeFor[valkeystream.DedupConfig](),
	reflect.TypeFor[valkeystream.ExpiringKeyRepositoryConfig](),
	reflect.TypeFor[valkeystream.HealthConfig](),
	reflect.TypeFor[valkeystream.ExactlyOnceConfig](),
}

// configDoc is where the configuration is documented.
const configDoc = "docs/configuration.md"

// configSections reads the sections of doc whose heading ("## Name") names
// a configuration type, by the name, each with the fields that the first
// column of its tables names ("| `Field` | ...").
func configSections(t *testing.T, doc string) map[string][]string {
	t.Helper()
	f, err := os.Open(doc)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	row := regexp.MustCompile("^\\| `([^`]+)` \\|")
	sections := make(map[string][]string)
	section := ""
	lines := bufio.NewScanner(f)
	for lines.Scan() {
		line := lines.Text()
		if heading, ok := strings.CutPrefix(line, "## "); ok {
			section = ""
			if heading = strings.TrimSpace(heading); strings.HasSuffix(heading, "Config") {
				section = heading
				sections[section] = nil
			}
			continue
		}
		if m := row.FindStringSubmatch(line); m != nil && section != "" {
			sections[section] = append(sections[section], m[1])
		}
	}
	if err := lines.Err(); err != nil {
		t.Fatal(err)
	}
	return sections
}

// exportedFields returns the names of t's exported fields.
func exportedFields(t reflect.Type) []string {
	var names []string
	for f := range t.Fields() {
		if f.IsExported() {
			names = append(names, f.Name)
		}
	}
	return names
}

// Every exported field of each configuration struct is listed in the
// struct's section of docs/configuration.md, and every field listed there
// exists.
func TestConfigurationDocListsEveryField(t *testing.T) {
	sections := configSections(t, configDoc)
	for _, typ := range configTypes {
		documented, ok := sections[typ.Name()]
		if !ok {
			t.Errorf("%s has no section %q in %s: add one with a table of its fields", typ.Name(), "## "+typ.Name(), configDoc)
			continue
		}
		fields := exportedFields(typ)
		for _, f := range fields {
			if !slices.Contains(documented, f) {
				t.Errorf("%s.%s is not in the table of section %q of %s: add a row for it", typ.Name(), f, typ.Name(), configDoc)
			}
		}
		for _, f := range documented {
			if !slices.Contains(fields, f) {
				t.Errorf("section %q of %s lists `%s`, which %s does not have: remove the row or fix its name", typ.Name(), configDoc, f, typ.Name())
			}
		}
		if seen := slices.Compact(slices.Sorted(slices.Values(documented))); len(seen) != len(documented) {
			t.Errorf("section %q of %s lists a field twice: %v", typ.Name(), configDoc, documented)
		}
	}
	for name := range sections {
		if !slices.ContainsFunc(configTypes, func(typ reflect.Type) bool { return typ.Name() == name }) {
			t.Errorf("%s has a section %q, but the package has no exported struct %s in configTypes", configDoc, name, name)
		}
	}
}

// Every `Type.Field` the doc names, in any section, exists.
func TestConfigurationDocNamesOnlyRealFields(t *testing.T) {
	doc, err := os.ReadFile(configDoc)
	if err != nil {
		t.Fatal(err)
	}
	byName := make(map[string][]string)
	for _, typ := range configTypes {
		byName[typ.Name()] = exportedFields(typ)
	}
	refs := regexp.MustCompile("`([A-Za-z]+Config)\\.([A-Za-z]+)`").FindAllStringSubmatch(string(doc), -1)
	if len(refs) == 0 {
		t.Fatalf("%s names no `Type.Field`; the sentinels table should name the field of each", configDoc)
	}
	for _, m := range refs {
		fields, ok := byName[m[1]]
		switch {
		case !ok:
			t.Errorf("%s names `%s.%s`, but %s is not a configuration type", configDoc, m[1], m[2], m[1])
		case !slices.Contains(fields, m[2]):
			t.Errorf("%s names `%s.%s`, which does not exist", configDoc, m[1], m[2])
		}
	}
}

// configTypes holds every exported struct of the package whose name ends in
// Config.
func TestConfigTypesAreEveryConfigStruct(t *testing.T) {
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	var found []string
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		for _, decl := range f.Decls {
			gen, ok := decl.(*ast.GenDecl)
			if !ok || gen.Tok != token.TYPE {
				continue
			}
			for _, spec := range gen.Specs {
				ts := spec.(*ast.TypeSpec)
				if _, isStruct := ts.Type.(*ast.StructType); isStruct && ts.Name.IsExported() && strings.HasSuffix(ts.Name.Name, "Config") {
					found = append(found, ts.Name.Name)
				}
			}
		}
	}
	if len(found) == 0 {
		t.Fatal("found no exported Config struct in the package")
	}
	for _, name := range found {
		if !slices.ContainsFunc(configTypes, func(typ reflect.Type) bool { return typ.Name() == name }) {
			t.Errorf("%s is not in configTypes: add it, and a section for it to %s", name, configDoc)
		}
	}
	for _, typ := range configTypes {
		if !slices.Contains(found, typ.Name()) {
			t.Errorf("configTypes holds %s, which is not an exported struct of the package", typ.Name())
		}
	}
}
