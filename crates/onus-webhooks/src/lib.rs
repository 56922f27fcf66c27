pub mod signing;
