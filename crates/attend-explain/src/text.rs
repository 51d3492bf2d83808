//! The notebooks' toy tokenisation: a sentence becomes ids into its own sorted
//! vocabulary (notebook 004).

/// A sentence's vocabulary and token ids.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SentenceVocab {
    /// The sorted unique words; a word's id is its index here.
    pub vocab: Vec<String>,
    /// The words of the sentence in order.
    pub words: Vec<String>,
    /// The id of each word.
    pub ids: Vec<usize>,
}

/// Removes `,` and `.`, splits on white space and numbers the sorted unique words,
/// as notebook 004 does.
///
/// ```
/// let s = attend_explain::text::sentence_vocab("Life is short, eat dessert first");
/// assert_eq!(s.vocab, ["Life", "dessert", "eat", "first", "is", "short"]);
/// assert_eq!(s.ids, [0, 4, 5, 2, 1, 3]);
/// ```
pub fn sentence_vocab(sentence: &str) -> SentenceVocab {
    let cleaned = sentence.replace([',', '.'], "");
    let words: Vec<String> = cleaned.split_whitespace().map(str::to_owned).collect();
    let mut vocab = words.clone();
    vocab.sort();
    vocab.dedup();
    let ids = words
        .iter()
        .map(|w| {
            vocab
                .binary_search(w)
                .expect("every word is in the vocabulary")
        })
        .collect();
    SentenceVocab { vocab, words, ids }
}
