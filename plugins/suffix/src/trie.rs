//! [`Trie`]: a depth-limited suffix trie that counts how often each path occurs.
//!
//! A node stands for the token string on the path from the root to it, at most `max_depth`
//! tokens long. Text is indexed one *start position* at a time: the path of start `j` is the
//! text from `j` on, cut at `max_depth` tokens (or at the end of the text), and indexing it adds
//! one to the count of every node on that path, creating the missing ones. So:
//!
//! * `count(s)` is the number of indexed start positions whose path goes through `s`: the
//!   number of occurrences of `s` in the indexed text;
//! * the root's count is the number of paths that entered the trie;
//! * a node's `best_child` is a child with the highest count; among equal counts, the one that
//!   reached that count last while counting up (the most recent continuation wins ties).
//!
//! A path can be extended one token at a time ([`Trie::enter`], for the live end of a context)
//! or indexed whole ([`Trie::insert`]); both count the same. [`Trie::remove`] undoes an
//! [`Trie::insert`], freeing nodes whose count drops to zero, so a trie can forget old text.
//!
//! # Layout
//!
//! Nodes live in an arena of fixed-size chunks, addressed by `u32` ids, so growing never copies
//! the nodes already there (the plugin's memory is capped, and a doubling `Vec` would briefly
//! need three times its size). A node is 20 bytes: its token, its count, its first child and
//! next sibling (children form a singly linked list, newest first) and its best child. Freed
//! nodes are kept on a free list threaded through `next_sibling` and reused first.
//!
//! Children of the root and of depth-1 nodes are found through one hash map per trie, keyed by
//! (parent, token): those nodes have up to a vocabulary's worth of children, where a list scan
//! would cost hundreds of steps per token. Deeper nodes have few children, and their lists are
//! scanned, best child first: in text that mostly repeats, the frequent continuation is the
//! oldest child, last in a list that collects every rare variation. The root keeps no list at all (only the map), because unlinking from a list of tens
//! of thousands of tokens would be slow, and nothing needs to walk the root's children in order.
//!
//! Not here: which start positions get indexed, and when (the session and the cross-request
//! cache decide), and what to propose from the counts (`speculate`).

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

use spechost_sdk::Token;

/// Index of a node in a [`Trie`]'s arena.
pub(crate) type NodeId = u32;

/// "No node": a missing child, an empty list, or a suffix the trie does not hold.
pub(crate) const NO_NODE: NodeId = NodeId::MAX;

/// The root, the empty string. It is never freed.
pub(crate) const ROOT: NodeId = 0;

/// Largest `max_nodes` a trie accepts: ids must stay below [`NO_NODE`].
pub(crate) const MAX_TRIE_NODES: usize = 1 << 30;

/// A token no vocabulary has (ids are below `vocab_size`, itself a `u32`): marks the end of a
/// finished text, so that every occurrence of a string in it is followed by something.
pub(crate) const END_OF_TEXT: Token = Token::MAX;

/// log2 of the nodes per arena chunk: 65,536 nodes, 1.25 MiB.
const CHUNK_BITS: u32 = 16;
/// Nodes per arena chunk.
const CHUNK_NODES: usize = 1 << CHUNK_BITS;
/// Children of nodes shallower than this are found through [`Trie::edges`], not by scanning.
const INDEXED_DEPTHS: usize = 2;

#[derive(Debug, Clone, Copy)]
struct Node {
    /// The last token of the node's string (unused for the root).
    token: Token,
    /// Occurrences of the node's string in the indexed text (see the module docs).
    count: u32,
    /// Newest child, head of the child list; always [`NO_NODE`] for the root.
    first_child: NodeId,
    /// Next older sibling; the next free node while on the free list.
    next_sibling: NodeId,
    /// A child with the highest count; [`NO_NODE`] without children, and always for the root.
    best_child: NodeId,
}

impl Node {
    fn new(token: Token) -> Self {
        Self {
            token,
            count: 0,
            first_child: NO_NODE,
            next_sibling: NO_NODE,
            best_child: NO_NODE,
        }
    }
}

/// A counted, depth-limited suffix trie in an arena of at most `max_nodes` nodes.
pub(crate) struct Trie {
    chunks: Vec<Vec<Node>>,
    /// Head of the free list, or [`NO_NODE`].
    free: NodeId,
    /// Nodes in use, the root included.
    live_nodes: usize,
    max_nodes: usize,
    /// (parent, token) -> child, for parents shallower than [`INDEXED_DEPTHS`].
    edges: HashMap<u64, NodeId, BuildHasherDefault<EdgeHasher>>,
}

impl Trie {
    /// An empty trie (just the root) that will never hold more than `max_nodes` nodes.
    ///
    /// `max_nodes` must be between 1 and [`MAX_TRIE_NODES`]; the caller validated it.
    pub(crate) fn new(max_nodes: usize) -> Self {
        debug_assert!((1..=MAX_TRIE_NODES).contains(&max_nodes), "{max_nodes}");
        let mut trie = Self {
            chunks: Vec::new(),
            free: NO_NODE,
            live_nodes: 0,
            max_nodes,
            edges: HashMap::default(),
        };
        let root = trie.allocate(0);
        debug_assert_eq!(root, ROOT);
        trie
    }

    /// Nodes in use, the root included; never more than `max_nodes`.
    pub(crate) fn live_nodes(&self) -> usize {
        self.live_nodes
    }

    /// Nodes that can still be created.
    pub(crate) fn room(&self) -> usize {
        self.max_nodes - self.live_nodes
    }

    /// Occurrences of `node`'s string in the indexed text.
    pub(crate) fn count(&self, node: NodeId) -> u32 {
        self.node(node).count
    }

    /// The last token of `node`'s string.
    pub(crate) fn token(&self, node: NodeId) -> Token {
        self.node(node).token
    }

    /// A child of `node` with the highest count, or [`NO_NODE`]. Not kept for the root.
    pub(crate) fn best_child(&self, node: NodeId) -> NodeId {
        self.node(node).best_child
    }

    /// Every child of `node`, newest first.
    pub(crate) fn children(&self, node: NodeId) -> impl Iterator<Item = NodeId> + '_ {
        std::iter::successors(
            Some(self.node(node).first_child).filter(|&child| child != NO_NODE),
            |&child| Some(self.node(child).next_sibling).filter(|&next| next != NO_NODE),
        )
    }

    /// The child of `parent` (a node at `depth`) for `token`, or [`NO_NODE`].
    pub(crate) fn child(&self, parent: NodeId, depth: usize, token: Token) -> NodeId {
        self.child_with_steps(parent, depth, token).0
    }

    /// Counts one more occurrence of `parent`'s string followed by `token`: finds or creates
    /// that child and adds one to its count (and to the root's, when `parent` is the root).
    ///
    /// Returns the child, or [`NO_NODE`] when it would have to be created and the trie is full;
    /// nothing is counted then.
    pub(crate) fn enter(&mut self, parent: NodeId, depth: usize, token: Token) -> NodeId {
        let mut child = self.child(parent, depth, token);
        if child == NO_NODE {
            if self.live_nodes == self.max_nodes {
                return NO_NODE;
            }
            child = self.allocate(token);
            self.link(parent, depth, child);
        }
        self.node_mut(child).count += 1;
        if parent == ROOT {
            self.node_mut(ROOT).count += 1;
        } else {
            let count = self.node(child).count;
            let best = self.node(parent).best_child;
            if best == NO_NODE || count >= self.node(best).count {
                self.node_mut(parent).best_child = child;
            }
        }
        child
    }

    /// Indexes one whole path (the text from a start position, at most `max_depth` tokens).
    ///
    /// Returns how many nodes it visited, or `None` if the trie filled up on the way; the
    /// prefix entered so far stays counted then. Check [`Trie::room`] first to keep paths whole.
    pub(crate) fn insert(&mut self, path: &[Token]) -> Option<usize> {
        let mut node = ROOT;
        for (depth, &token) in path.iter().enumerate() {
            node = self.enter(node, depth, token);
            if node == NO_NODE {
                return None;
            }
        }
        Some(path.len())
    }

    /// Undoes one [`Trie::insert`] of `path`: subtracts one along it, frees nodes whose count
    /// reaches zero and re-chooses best children that lost a count.
    ///
    /// Returns the steps it took (nodes visited plus siblings scanned), for work budgets.
    ///
    /// # Panics
    ///
    /// If `path` was not inserted: counts would no longer match the text.
    pub(crate) fn remove(&mut self, path: &[Token]) -> usize {
        let mut steps = 0;
        let mut parent = ROOT;
        self.node_mut(ROOT).count -= 1;
        for (depth, &token) in path.iter().enumerate() {
            let (child, scanned) = self.child_with_steps(parent, depth, token);
            steps += 1 + scanned;
            assert_ne!(child, NO_NODE, "removing a path that was never inserted");
            let count = {
                let node = self.node_mut(child);
                node.count -= 1;
                node.count
            };
            if count == 0 {
                steps += self.unlink(parent, depth, child);
                steps += self.recheck_best_child(parent, child, count);
                // Every other descendant already had count zero and was freed, so what is left
                // below `child` is the rest of this path: one child per node.
                steps += self.free_chain(child, depth + 1);
                return steps;
            }
            steps += self.recheck_best_child(parent, child, count);
            parent = child;
        }
        steps
    }

    /// Moves the suffix nodes of a growing text one token on, counting the new occurrences.
    ///
    /// `suffixes[d]` is the node of the text's last `d` tokens (or [`NO_NODE`]); its length is
    /// `max_depth + 1` and `suffixes[0]` is the root. Each suffix shorter than `max_depth` gains
    /// `token` ([`Trie::enter`]); the one of length `max_depth` is complete and drops out. With
    /// `start_new`, `token` alone becomes the suffix of length 1 (a new start position);
    /// without, that slot is left empty, for when its start position is indexed later.
    ///
    /// Returns the steps taken, for work budgets.
    pub(crate) fn extend_suffixes(
        &mut self,
        suffixes: &mut [NodeId],
        token: Token,
        start_new: bool,
    ) -> usize {
        let max_depth = suffixes.len() - 1;
        for depth in (1..max_depth).rev() {
            let node = suffixes[depth];
            suffixes[depth + 1] = if node == NO_NODE {
                NO_NODE
            } else {
                self.enter(node, depth, token)
            };
        }
        suffixes[1] = if start_new {
            self.enter(ROOT, 0, token)
        } else {
            NO_NODE
        };
        max_depth
    }

    /// Like [`Trie::extend_suffixes`] with `start_new`, but only follows existing children: for
    /// matching a text against a trie that does not index it.
    pub(crate) fn follow_suffixes(&self, suffixes: &mut [NodeId], token: Token) {
        let max_depth = suffixes.len() - 1;
        for depth in (1..max_depth).rev() {
            let node = suffixes[depth];
            suffixes[depth + 1] = if node == NO_NODE {
                NO_NODE
            } else {
                self.child(node, depth, token)
            };
        }
        suffixes[1] = self.child(ROOT, 0, token);
    }

    /// Fills `suffixes` (as in [`Trie::extend_suffixes`]) for the end of `text` from scratch,
    /// walking each suffix down from the root: `O(max_depth^2)` steps at worst.
    pub(crate) fn find_suffixes(&self, text: &[Token], suffixes: &mut [NodeId]) {
        suffixes[0] = ROOT;
        for (length, suffix) in suffixes.iter_mut().enumerate().skip(1) {
            *suffix = match text.len().checked_sub(length) {
                None => NO_NODE,
                Some(start) => self.find(&text[start..]),
            };
        }
    }

    /// Completes `suffixes` for the end of `text` after the trie only gained paths: looks up the
    /// suffixes longer than the longest one held, shortest first, until one is missing.
    ///
    /// Exact when `suffixes` holds the nodes of the suffixes of length `1..=n` for some `n`
    /// (nodes that still stand for their strings, as none was removed) and the trie is
    /// suffix-closed, so that a missing suffix has no longer one. Typically one failed lookup,
    /// `O(max_depth)` steps; at worst those of [`Trie::find_suffixes`].
    pub(crate) fn find_longer_suffixes(&self, text: &[Token], suffixes: &mut [NodeId]) {
        let held = suffixes[1..]
            .iter()
            .take_while(|&&node| node != NO_NODE)
            .count();
        for (length, suffix) in suffixes.iter_mut().enumerate().skip(held + 1) {
            let Some(start) = text.len().checked_sub(length) else {
                return;
            };
            let node = self.find(&text[start..]);
            if node == NO_NODE {
                return;
            }
            *suffix = node;
        }
    }

    /// The node of `path`, or [`NO_NODE`].
    pub(crate) fn find(&self, path: &[Token]) -> NodeId {
        let mut node = ROOT;
        for (depth, &token) in path.iter().enumerate() {
            node = self.child(node, depth, token);
            if node == NO_NODE {
                break;
            }
        }
        node
    }

    /// Calls `visit(path, count, best_child)` for every node but the root, in no particular
    /// order, `best_child` being the best child's token and count; for tests that compare the
    /// trie with a brute-force count.
    #[cfg(test)]
    pub(crate) fn for_each_node(&self, mut visit: impl FnMut(&[Token], u32, Option<(Token, u32)>)) {
        let mut path = Vec::new();
        let mut root_children: Vec<NodeId> = self
            .edges
            .iter()
            .filter(|&(&key, _)| key >> 32 == u64::from(ROOT))
            .map(|(_, &child)| child)
            .collect();
        root_children.sort_unstable();
        for child in root_children {
            self.visit_subtree(child, &mut path, &mut visit);
        }
    }

    #[cfg(test)]
    fn visit_subtree(
        &self,
        node: NodeId,
        path: &mut Vec<Token>,
        visit: &mut impl FnMut(&[Token], u32, Option<(Token, u32)>),
    ) {
        let Node {
            token,
            count,
            best_child,
            first_child,
            ..
        } = *self.node(node);
        path.push(token);
        let best = (best_child != NO_NODE).then(|| {
            let best = self.node(best_child);
            (best.token, best.count)
        });
        visit(path, count, best);
        let mut child = first_child;
        while child != NO_NODE {
            self.visit_subtree(child, path, visit);
            child = self.node(child).next_sibling;
        }
        path.pop();
    }

    /// Entries in the edge map; for tests that check a trie emptied completely.
    #[cfg(test)]
    pub(crate) fn indexed_edges(&self) -> usize {
        self.edges.len()
    }

    /// The child for `token` and how many siblings were scanned to find it.
    fn child_with_steps(&self, parent: NodeId, depth: usize, token: Token) -> (NodeId, usize) {
        if depth < INDEXED_DEPTHS {
            let child = self.edges.get(&edge_key(parent, token)).copied();
            return (child.unwrap_or(NO_NODE), 0);
        }
        // The most frequent continuation is the likeliest token, but as the oldest child it
        // often sits at the end of the list, behind rare ones: try it first.
        let Node {
            best_child,
            first_child,
            ..
        } = *self.node(parent);
        if best_child != NO_NODE && self.node(best_child).token == token {
            return (best_child, 0);
        }
        let mut scanned = 0;
        let mut child = first_child;
        while child != NO_NODE {
            let node = self.node(child);
            if node.token == token {
                break;
            }
            scanned += 1;
            child = node.next_sibling;
        }
        (child, scanned)
    }

    /// Makes the fresh node `child` a child of `parent` (at `depth`).
    fn link(&mut self, parent: NodeId, depth: usize, child: NodeId) {
        if depth < INDEXED_DEPTHS {
            let token = self.node(child).token;
            self.edges.insert(edge_key(parent, token), child);
        }
        if parent != ROOT {
            let head = self.node(parent).first_child;
            self.node_mut(child).next_sibling = head;
            self.node_mut(parent).first_child = child;
        }
    }

    /// Takes `child` out of `parent`'s children; returns the siblings scanned.
    fn unlink(&mut self, parent: NodeId, depth: usize, child: NodeId) -> usize {
        if depth < INDEXED_DEPTHS {
            let token = self.node(child).token;
            self.edges.remove(&edge_key(parent, token));
        }
        if parent == ROOT {
            return 0;
        }
        let next = self.node(child).next_sibling;
        let head = self.node(parent).first_child;
        if head == child {
            self.node_mut(parent).first_child = next;
            return 0;
        }
        let mut scanned = 1;
        let mut previous = head;
        loop {
            let after = self.node(previous).next_sibling;
            assert_ne!(after, NO_NODE, "a child is missing from its parent's list");
            if after == child {
                self.node_mut(previous).next_sibling = next;
                return scanned;
            }
            scanned += 1;
            previous = after;
        }
    }

    /// After `child` of `parent` lost one count, down to `count`: chooses `parent`'s best child
    /// again if `child` was it and may no longer be; returns the children scanned.
    ///
    /// The children's counts add up to at most the parent's (each occurrence of a child's
    /// string is one of the parent's), so a best child that keeps more than half of the
    /// parent's count is still the only one with the highest: in repetitive text, where
    /// evicting old responses lowers the frequent continuations over and over, that saves
    /// scanning their long lists of rare siblings.
    fn recheck_best_child(&mut self, parent: NodeId, child: NodeId, count: u32) -> usize {
        if parent == ROOT || self.node(parent).best_child != child {
            return 0;
        }
        if u64::from(count) * 2 > u64::from(self.node(parent).count) {
            return 0;
        }
        self.choose_best_child(parent)
    }

    /// Points `parent`'s best child at a child with the highest count (the newest among
    /// equals); returns the children scanned.
    fn choose_best_child(&mut self, parent: NodeId) -> usize {
        let mut scanned = 0;
        let mut best = NO_NODE;
        let mut best_count = 0;
        let mut child = self.node(parent).first_child;
        while child != NO_NODE {
            let node = self.node(child);
            if node.count > best_count {
                (best, best_count) = (child, node.count);
            }
            scanned += 1;
            child = node.next_sibling;
        }
        self.node_mut(parent).best_child = best;
        scanned
    }

    /// Frees `node` (at `depth`, count already zero) and the chain below it, the rest of the
    /// path being removed, whose nodes count only that path; returns the nodes freed.
    fn free_chain(&mut self, mut node: NodeId, mut depth: usize) -> usize {
        let mut freed = 0;
        while node != NO_NODE {
            let Node {
                count, first_child, ..
            } = *self.node(node);
            debug_assert!(count <= 1, "freeing a node that counts other occurrences");
            if first_child != NO_NODE {
                debug_assert_eq!(self.node(first_child).next_sibling, NO_NODE);
                if depth < INDEXED_DEPTHS {
                    let token = self.node(first_child).token;
                    self.edges.remove(&edge_key(node, token));
                }
            }
            *self.node_mut(node) = Node {
                next_sibling: self.free,
                ..Node::new(0)
            };
            self.free = node;
            self.live_nodes -= 1;
            freed += 1;
            node = first_child;
            depth += 1;
        }
        freed
    }

    /// A fresh node for `token`, from the free list or the end of the arena.
    fn allocate(&mut self, token: Token) -> NodeId {
        debug_assert!(self.live_nodes < self.max_nodes);
        self.live_nodes += 1;
        if self.free != NO_NODE {
            let id = self.free;
            self.free = self.node(id).next_sibling;
            *self.node_mut(id) = Node::new(token);
            return id;
        }
        if self
            .chunks
            .last()
            .is_none_or(|chunk| chunk.len() == CHUNK_NODES)
        {
            // The first chunk grows like a `Vec`, so that small tries stay small; later ones
            // are allocated whole.
            let capacity = if self.chunks.is_empty() {
                0
            } else {
                CHUNK_NODES
            };
            self.chunks.push(Vec::with_capacity(capacity));
        }
        let chunk_index = self.chunks.len() - 1;
        let chunk = &mut self.chunks[chunk_index];
        let id = (chunk_index << CHUNK_BITS) | chunk.len();
        chunk.push(Node::new(token));
        NodeId::try_from(id).expect("ids stay below MAX_TRIE_NODES")
    }

    fn node(&self, id: NodeId) -> &Node {
        &self.chunks[(id >> CHUNK_BITS) as usize][id as usize & (CHUNK_NODES - 1)]
    }

    fn node_mut(&mut self, id: NodeId) -> &mut Node {
        &mut self.chunks[(id >> CHUNK_BITS) as usize][id as usize & (CHUNK_NODES - 1)]
    }
}

/// The edge map's key for `parent`'s child `token`.
fn edge_key(parent: NodeId, token: Token) -> u64 {
    (u64::from(parent) << 32) | u64::from(token)
}

/// A `Hasher` for [`edge_key`]s: MurmurHash3's `fmix64`, which spreads every key bit over the
/// hash (hashbrown takes buckets from the low bits and tags from the high ones).
///
/// Also keeps `std`'s randomly seeded hasher out of the plugin, which would need the host's
/// random source at every session start.
#[derive(Default)]
struct EdgeHasher(u64);

impl Hasher for EdgeHasher {
    fn finish(&self) -> u64 {
        let mut hash = self.0;
        hash ^= hash >> 33;
        hash = hash.wrapping_mul(0xff51_afd7_ed55_8ccd);
        hash ^= hash >> 33;
        hash = hash.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
        hash ^ (hash >> 33)
    }

    fn write(&mut self, bytes: &[u8]) {
        // Only `write_u64` is used for `u64` keys; fold anything else in all the same.
        for &byte in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(byte)).wrapping_mul(0x100_0000_01b3);
        }
    }

    fn write_u64(&mut self, key: u64) {
        self.0 = key;
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use std::collections::BTreeMap;

    use super::*;

    /// Counts of every substring of length `1..=max_depth` of each text, by brute force.
    pub(crate) fn substring_counts<'a>(
        texts: impl IntoIterator<Item = &'a [Token]>,
        max_depth: usize,
    ) -> BTreeMap<Vec<Token>, u32> {
        let mut counts = BTreeMap::new();
        for text in texts {
            for start in 0..text.len() {
                for end in start + 1..=(start + max_depth).min(text.len()) {
                    *counts.entry(text[start..end].to_vec()).or_default() += 1;
                }
            }
        }
        counts
    }

    /// Every node's count, by path, checking on the way that each best child has the highest
    /// count among its siblings.
    pub(crate) fn trie_counts(trie: &Trie) -> BTreeMap<Vec<Token>, u32> {
        let mut counts = BTreeMap::new();
        trie.for_each_node(|path, count, _| {
            counts.insert(path.to_vec(), count);
        });
        check_best_children(trie);
        counts
    }

    /// Asserts that every node's best child has the highest count among its children.
    fn check_best_children(trie: &Trie) {
        let mut child_max: BTreeMap<Vec<Token>, u32> = BTreeMap::new();
        let mut best: BTreeMap<Vec<Token>, Option<u32>> = BTreeMap::new();
        trie.for_each_node(|path, count, best_child| {
            best.insert(path.to_vec(), best_child.map(|(_, count)| count));
            if path.len() > 1 {
                let parent = child_max
                    .entry(path[..path.len() - 1].to_vec())
                    .or_default();
                *parent = (*parent).max(count);
            }
        });
        for (path, best_count) in best {
            let expected = child_max.get(&path).copied();
            assert_eq!(
                best_count, expected,
                "best child count of {path:?} (none means no children)"
            );
        }
    }

    /// Indexes every start position of `text` whole, as the cross-request cache does.
    fn insert_text(trie: &mut Trie, text: &[Token], max_depth: usize) {
        for start in 0..text.len() {
            let path = &text[start..(start + max_depth).min(text.len())];
            assert!(trie.insert(path).is_some(), "trie full at start {start}");
        }
    }

    fn remove_text(trie: &mut Trie, text: &[Token], max_depth: usize) {
        for start in 0..text.len() {
            trie.remove(&text[start..(start + max_depth).min(text.len())]);
        }
    }

    /// A tiny deterministic generator, so tests need no `rand`.
    pub(crate) struct Lcg(pub(crate) u64);

    impl Lcg {
        pub(crate) fn below(&mut self, bound: u32) -> u32 {
            self.0 = self
                .0
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            ((self.0 >> 33) % u64::from(bound)) as u32
        }

        pub(crate) fn text(&mut self, len: usize, alphabet: u32) -> Vec<Token> {
            (0..len).map(|_| self.below(alphabet)).collect()
        }
    }

    #[test]
    fn counts_occurrences_of_every_substring() {
        let mut trie = Trie::new(1000);
        let text = [1, 2, 1, 2, 3];
        insert_text(&mut trie, &text, 3);
        assert_eq!(trie_counts(&trie), substring_counts([&text[..]], 3));
        assert_eq!(trie.count(ROOT), 5, "one path per start position");
    }

    #[test]
    fn best_child_prefers_higher_counts_then_the_latest_to_reach_them() {
        let mut trie = Trie::new(100);
        let one = trie.enter(ROOT, 0, 1);
        let two = trie.enter(one, 1, 2);
        assert_eq!(trie.best_child(one), two);
        let three = trie.enter(one, 1, 3);
        assert_eq!(trie.best_child(one), three, "a tie goes to the latest");
        trie.enter(one, 1, 2);
        assert_eq!(trie.best_child(one), two, "2 now has the higher count");
        assert_eq!(trie.count(one), 1, "enter counts the child, not the parent");
    }

    #[test]
    fn enter_returns_no_node_when_full_and_counts_nothing() {
        let mut trie = Trie::new(3);
        let one = trie.enter(ROOT, 0, 1);
        let two = trie.enter(one, 1, 2);
        assert_eq!(trie.live_nodes(), 3);
        assert_eq!(trie.enter(two, 2, 9), NO_NODE);
        assert_eq!(trie.enter(ROOT, 0, 9), NO_NODE);
        assert_eq!(trie.enter(ROOT, 0, 1), one, "existing nodes still count");
        assert_eq!(trie.count(one), 2);
        assert_eq!(trie.count(ROOT), 2);
    }

    #[test]
    fn matches_brute_force_counts_on_random_texts() {
        let mut random = Lcg(11);
        for max_depth in [1, 2, 3, 5] {
            for alphabet in [2, 3, 7] {
                let mut trie = Trie::new(100_000);
                let text = random.text(200, alphabet);
                insert_text(&mut trie, &text, max_depth);
                assert_eq!(
                    trie_counts(&trie),
                    substring_counts([&text[..]], max_depth),
                    "depth {max_depth}, alphabet {alphabet}"
                );
            }
        }
    }

    #[test]
    fn removing_some_texts_leaves_the_counts_of_the_others() {
        let mut random = Lcg(5);
        let max_depth = 4;
        let texts: Vec<Vec<Token>> = (0..6).map(|i| random.text(30 + 7 * i, 4)).collect();
        let mut trie = Trie::new(100_000);
        for text in &texts {
            insert_text(&mut trie, text, max_depth);
        }
        for removed in [1, 4, 0] {
            remove_text(&mut trie, &texts[removed], max_depth);
        }
        let kept = [&texts[2][..], &texts[3][..], &texts[5][..]];
        assert_eq!(trie_counts(&trie), substring_counts(kept, max_depth));
    }

    #[test]
    fn removing_everything_frees_every_node_for_reuse() {
        let mut random = Lcg(9);
        let max_depth = 6;
        let texts: Vec<Vec<Token>> = (0..5).map(|_| random.text(80, 5)).collect();
        let mut trie = Trie::new(100_000);
        for text in &texts {
            insert_text(&mut trie, text, max_depth);
        }
        let peak = trie.live_nodes();
        for text in texts.iter().rev() {
            remove_text(&mut trie, text, max_depth);
        }
        assert_eq!(trie.live_nodes(), 1, "only the root is left");
        assert_eq!(trie.count(ROOT), 0);
        assert_eq!(trie.indexed_edges(), 0, "edge map entries left behind");
        assert!(trie_counts(&trie).is_empty());

        insert_text(&mut trie, &texts[0], max_depth);
        let chunks = trie.chunks.iter().map(Vec::len).sum::<usize>();
        assert!(
            chunks <= peak,
            "{chunks} slots after reuse, {peak} at the peak"
        );
        assert_eq!(trie_counts(&trie), substring_counts([&texts[0][..]], 6));
    }

    #[test]
    fn the_best_child_is_found_and_kept_without_scanning_while_it_holds_a_majority() {
        let mut trie = Trie::new(1000);
        // After [1, 2]: 3 five times, then 4, 5 and 6 once each, newer, so ahead in the list.
        for _ in 0..5 {
            trie.insert(&[1, 2, 3]);
        }
        for token in [4, 5, 6] {
            trie.insert(&[1, 2, token]);
        }
        let two = trie.find(&[1, 2]);
        assert_eq!(trie.token(trie.best_child(two)), 3);
        assert_eq!(
            trie.child_with_steps(two, 2, 3),
            (trie.best_child(two), 0),
            "the best child is tried first"
        );
        // 3 keeps 4 of 7 occurrences: no sibling can match it, so none is scanned.
        assert_eq!(trie.remove(&[1, 2, 3]), 3, "one step per node");
        assert_eq!(trie.token(trie.best_child(two)), 3);
        // At 3 of 6 the siblings are scanned, and 3 is still the best.
        assert_eq!(
            trie.remove(&[1, 2, 3]),
            3 + 4,
            "and a scan of the four children"
        );
        assert_eq!(trie.token(trie.best_child(two)), 3);
        // At 1 of 4 all tie, and the newest wins.
        trie.remove(&[1, 2, 3]);
        trie.remove(&[1, 2, 3]);
        assert_eq!(trie.token(trie.best_child(two)), 6);
        assert_eq!(trie.count(trie.best_child(two)), 1);
    }

    #[test]
    fn longer_suffixes_found_after_insertions_equal_a_fresh_lookup() {
        let mut random = Lcg(19);
        let max_depth = 6;
        let mut trie = Trie::new(100_000);
        let text = random.text(60, 3);
        insert_text(&mut trie, &text[..30], max_depth);
        let mut suffixes = vec![NO_NODE; max_depth + 1];
        trie.find_suffixes(&text, &mut suffixes);
        // More text makes longer suffixes of `text` appear; nothing is removed.
        insert_text(&mut trie, &text[25..], max_depth);
        let mut fresh = vec![NO_NODE; max_depth + 1];
        trie.find_suffixes(&text, &mut fresh);
        assert_ne!(suffixes, fresh, "the insertion made a difference");
        trie.find_longer_suffixes(&text, &mut suffixes);
        assert_eq!(suffixes, fresh);
    }

    #[test]
    fn a_node_is_20_bytes_as_documented() {
        assert_eq!(size_of::<Node>(), 20);
    }

    #[test]
    fn node_ids_cross_chunk_boundaries() {
        let mut trie = Trie::new(CHUNK_NODES * 3);
        let text: Vec<Token> = (0..(CHUNK_NODES as Token + 100)).collect();
        insert_text(&mut trie, &text, 2);
        assert!(trie.chunks.len() >= 2, "{} chunks", trie.chunks.len());
        let last = trie.child(ROOT, 0, text[text.len() - 2]);
        let pair = trie.child(last, 1, text[text.len() - 1]);
        assert_eq!(trie.count(pair), 1);
        assert_eq!(trie.token(pair), text[text.len() - 1]);
    }
}
