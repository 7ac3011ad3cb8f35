//! The one shape of grammar llama.cpp cannot follow in reasonable time: a repetition (`*`,
//! `+`, `{m,}`, `{m,n}` with `n > 1`) of something that can match nothing, such as
//! `([a-z]* " "?)+` or `x+` with `x ::= [a-z]?`. llama.cpp tracks every way the text so far
//! can be parsed, and each empty iteration is another way: eight such elements take it tens of
//! seconds for one token, on the thread that verifies every request's rounds. Such a grammar
//! is refused before it is used, naming the rule; the same language is always expressible
//! without it (`([a-z]+ " "?)+`).
//!
//! The check reads GBNF only as far as it needs (rules, sequences, alternatives, groups,
//! literals, character classes, repetitions); llama.cpp's parser still judges the syntax.

use std::collections::HashMap;

/// One element of a sequence, with its repetition.
#[derive(Debug)]
struct Item {
    atom: Atom,
    /// Whether it may occur more than once.
    repeated: bool,
    /// Whether it may occur zero times.
    optional: bool,
}

#[derive(Debug)]
enum Atom {
    /// Something that matches at least one character or token (a literal with text, a
    /// character class, `.`, a `<token>`).
    Terminal,
    /// `""`: matches nothing.
    Empty,
    /// Another rule.
    Rule(String),
    /// A parenthesised group of alternatives.
    Group(Vec<Vec<Item>>),
}

/// The first rule (by name) that repeats something able to match nothing, if any.
pub(super) fn nullable_repetition(gbnf: &str) -> Option<String> {
    let rules = parse_rules(gbnf);
    let nullable = nullable_rules(&rules);
    let mut names: Vec<&String> = rules.keys().collect();
    names.sort();
    names
        .into_iter()
        .find(|name| repeats_nullable(&rules[*name], &nullable))
        .cloned()
}

fn repeats_nullable(alternatives: &[Vec<Item>], nullable: &HashMap<&str, bool>) -> bool {
    alternatives.iter().flatten().any(|item| {
        (item.repeated && atom_nullable(&item.atom, nullable))
            || matches!(&item.atom, Atom::Group(inner) if repeats_nullable(inner, nullable))
    })
}

/// Which rules can match nothing: a least fixed point over the rules.
fn nullable_rules(rules: &HashMap<String, Vec<Vec<Item>>>) -> HashMap<&str, bool> {
    let mut nullable: HashMap<&str, bool> =
        rules.keys().map(|name| (name.as_str(), false)).collect();
    loop {
        let mut changed = false;
        for (name, alternatives) in rules {
            if !nullable[name.as_str()] && alternatives_nullable(alternatives, &nullable) {
                nullable.insert(name, true);
                changed = true;
            }
        }
        if !changed {
            return nullable;
        }
    }
}

fn alternatives_nullable(alternatives: &[Vec<Item>], nullable: &HashMap<&str, bool>) -> bool {
    alternatives.iter().any(|sequence| {
        sequence
            .iter()
            .all(|item| item.optional || atom_nullable(&item.atom, nullable))
    })
}

fn atom_nullable(atom: &Atom, nullable: &HashMap<&str, bool>) -> bool {
    match atom {
        Atom::Terminal => false,
        Atom::Empty => true,
        Atom::Rule(name) => nullable.get(name.as_str()).copied().unwrap_or(false),
        Atom::Group(alternatives) => alternatives_nullable(alternatives, nullable),
    }
}

/// A lexical token of GBNF.
#[derive(Debug, PartialEq)]
enum Lexeme {
    Name(String),
    Define,
    Bar,
    Open,
    Close,
    /// A terminal; `false` for the empty literal `""`.
    Terminal(bool),
    /// A postfix repetition: (may repeat, may be absent).
    Postfix(bool, bool),
}

fn lex(gbnf: &str) -> Vec<Lexeme> {
    let chars: Vec<char> = gbnf.chars().collect();
    let mut lexemes = Vec::new();
    let mut at = 0;
    // The end of a quoted or bracketed run starting at `at` (its opening `open`), past the
    // closing `close`; backslash escapes skipped.
    let skip = |mut at: usize, close: char| {
        at += 1;
        let start = at;
        while at < chars.len() && chars[at] != close {
            at += if chars[at] == '\\' { 2 } else { 1 };
        }
        (at + 1, at.min(chars.len()) - start)
    };
    while at < chars.len() {
        let c = chars[at];
        match c {
            '#' => {
                while at < chars.len() && chars[at] != '\n' {
                    at += 1;
                }
            }
            '"' => {
                let (next, length) = skip(at, '"');
                lexemes.push(Lexeme::Terminal(length > 0));
                at = next;
            }
            '[' => {
                at = skip(at, ']').0;
                lexemes.push(Lexeme::Terminal(true));
            }
            '<' => {
                at = skip(at, '>').0;
                lexemes.push(Lexeme::Terminal(true));
            }
            '.' => {
                lexemes.push(Lexeme::Terminal(true));
                at += 1;
            }
            ':' if chars.get(at + 1) == Some(&':') && chars.get(at + 2) == Some(&'=') => {
                lexemes.push(Lexeme::Define);
                at += 3;
            }
            '|' => {
                lexemes.push(Lexeme::Bar);
                at += 1;
            }
            '(' => {
                lexemes.push(Lexeme::Open);
                at += 1;
            }
            ')' => {
                lexemes.push(Lexeme::Close);
                at += 1;
            }
            // `*`: may repeat, may be absent; `+`: may repeat; `?`: may be absent.
            '*' | '+' | '?' => {
                lexemes.push(Lexeme::Postfix(c != '?', c != '+'));
                at += 1;
            }
            '{' => {
                let end = chars[at..]
                    .iter()
                    .position(|&c| c == '}')
                    .map_or(chars.len(), |p| at + p);
                let bounds: String = chars[at + 1..end.min(chars.len())].iter().collect();
                let (low, high) = bounds.split_once(',').unwrap_or((&bounds, &bounds));
                let low: usize = low.trim().parse().unwrap_or(0);
                let repeated = high.trim().parse::<usize>().map_or(true, |high| high > 1);
                lexemes.push(Lexeme::Postfix(repeated, low == 0));
                at = end + 1;
            }
            c if c.is_ascii_alphanumeric() || c == '-' || c == '_' => {
                let start = at;
                while at < chars.len()
                    && (chars[at].is_ascii_alphanumeric() || chars[at] == '-' || chars[at] == '_')
                {
                    at += 1;
                }
                lexemes.push(Lexeme::Name(chars[start..at].iter().collect()));
            }
            _ => at += 1,
        }
    }
    lexemes
}

/// Rules by name, each a list of alternatives (sequences of items). A rule given twice keeps
/// both bodies as alternatives.
fn parse_rules(gbnf: &str) -> HashMap<String, Vec<Vec<Item>>> {
    let lexemes = lex(gbnf);
    let mut rules: HashMap<String, Vec<Vec<Item>>> = HashMap::new();
    let mut at = 0;
    while at < lexemes.len() {
        let Lexeme::Name(name) = &lexemes[at] else {
            at += 1;
            continue;
        };
        if lexemes.get(at + 1) != Some(&Lexeme::Define) {
            at += 1;
            continue;
        }
        // The body runs to the next `name ::=`.
        let start = at + 2;
        let mut end = start;
        while end < lexemes.len()
            && !(matches!(lexemes[end], Lexeme::Name(_))
                && lexemes.get(end + 1) == Some(&Lexeme::Define))
        {
            end += 1;
        }
        let mut cursor = start;
        let alternatives = parse_alternatives(&lexemes[..end], &mut cursor);
        rules.entry(name.clone()).or_default().extend(alternatives);
        at = end;
    }
    rules
}

fn parse_alternatives(lexemes: &[Lexeme], at: &mut usize) -> Vec<Vec<Item>> {
    let mut alternatives = vec![Vec::new()];
    while *at < lexemes.len() {
        let atom = match &lexemes[*at] {
            Lexeme::Close => {
                *at += 1;
                return alternatives;
            }
            Lexeme::Bar => {
                alternatives.push(Vec::new());
                *at += 1;
                continue;
            }
            Lexeme::Define | Lexeme::Postfix(..) => {
                *at += 1;
                continue;
            }
            Lexeme::Terminal(true) => Atom::Terminal,
            Lexeme::Terminal(false) => Atom::Empty,
            Lexeme::Name(name) => Atom::Rule(name.clone()),
            Lexeme::Open => {
                *at += 1;
                let inner = parse_alternatives(lexemes, at);
                *at -= 1;
                Atom::Group(inner)
            }
        };
        *at += 1;
        let mut item = Item {
            atom,
            repeated: false,
            optional: false,
        };
        while let Some(Lexeme::Postfix(repeated, optional)) = lexemes.get(*at) {
            item.repeated |= *repeated;
            item.optional |= *optional;
            *at += 1;
        }
        if let Some(sequence) = alternatives.last_mut() {
            sequence.push(item);
        }
    }
    alternatives
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repetitions_of_what_can_match_nothing_are_found_by_rule() {
        for (gbnf, rule) in [
            ("root ::= (\"a\"*)*", "root"),
            ("root ::= ([a-z ]* [a-z ]*)+ \".\"", "root"),
            ("root ::= x{2,}\nx ::= [a-z]? # comment", "root"),
            ("root ::= \"a\" y\ny ::= (z z)*\nz ::= \"\" | \"b\"", "y"),
        ] {
            assert_eq!(nullable_repetition(gbnf).as_deref(), Some(rule), "{gbnf}");
        }
    }

    #[test]
    fn ordinary_grammars_pass() {
        for gbnf in [
            "root ::= \"yes\" | \"no\"",
            "root ::= ([a-z]+ \" \"?)+ \".\"",
            "root ::= (([a-z]+ \" \"?)+)+ \".\"",
            "root ::= \"[\" ws (item (\",\" ws item)*)? \"]\"\nitem ::= [0-9]+\nws ::= [ \\t\\n]{0,20}",
            "root ::= x? x?\nx ::= \"(\" | \")*\"",
            "root ::= [\\]*]+ \"{\" \"}\"",
        ] {
            assert_eq!(nullable_repetition(gbnf), None, "{gbnf}");
        }
    }
}
