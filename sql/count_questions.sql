SELECT count(*) FROM questions;
